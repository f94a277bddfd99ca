"""The `workbench` command line: thin Typer commands that build a config and call a service."""
