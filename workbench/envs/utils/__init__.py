"""Helpers at the paths verifiers has them (`verifiers.utils.data_utils` -> `workbench.envs.utils.data_utils`)."""
