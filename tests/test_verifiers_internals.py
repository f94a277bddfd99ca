"""workbench/envs/verifiers_rewards.py uses verifiers' private rubric API (there is no public one):
if a verifiers release renames or reshapes it, this fails loudly, not a run's reward errors quietly."""

from __future__ import annotations

import inspect

import pytest

vf = pytest.importorskip("verifiers")


def test_the_rubric_call_points_take_the_arguments_we_pass_by_name():
    individual = inspect.signature(vf.Rubric._call_individual_reward_func).parameters
    group = inspect.signature(vf.Rubric._call_group_reward_func).parameters
    assert list(individual)[1:] == ["func", "state"] and list(group)[1:] == ["func", "states"]


def test_reward_weights_of_a_rubric_group_by_name():
    from workbench.envs.verifiers_rewards import reward_weights

    def correct(completion, answer) -> float:
        return 1.0

    def length(completion) -> float:
        return 0.0

    group = vf.RubricGroup(
        [vf.Rubric(funcs=[correct], weights=[1.0]), vf.Rubric(funcs=[length], weights=[0.0])]
    )
    assert reward_weights(group) == {"correct": 1.0, "length": 0.0}
