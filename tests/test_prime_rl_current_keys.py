"""prime-rl's current settings (issue 34): the keys its newest docs show either land on a workbench
field (`[trainer.loss]` -> loss = "dppo" and its knobs, `group_size`, `[monitors.wandb]`,
`run.name`, `max_off_policy_steps`) or are listed by the dry run as "not supported here: KEY",
never dropped silently; `max_async_level` still works, and the plan says how each is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_train_config import one_line_error, workbench, write
from workbench.train.config import load_train_config
from workbench.train.plan import async_text
from workbench.train.translate import UNSUPPORTED, translate

# Written after prime-rl's current reverse-text example and docs ("Useful Knobs", algorithms):
# its newer keys next to ones workbench applies.
CURRENT = """
max_steps = 4
seq_len = 512
clean = true

[model]
name = "tiny"

[monitors.wandb]
project = "reverse-text"
name = "rt-dppo"

[run]
name = "rt-current"

[orchestrator]
batch_size = 16
group_size = 4
max_off_policy_steps = 3

[orchestrator.algo]
type = "grpo"

[orchestrator.train.sampling]
max_completion_tokens = 64
temperature = 0.9

[[orchestrator.train.source]]
name = "reverse-text"

[orchestrator.train.source.env.taskset]
id = "reverse-text"

[orchestrator.renderer]
name = "auto"

[trainer.loss]
type = "default"
dppo_mask_low = 0.1
kl_tau = 0.002

[log]
level = "debug"
"""

NOT_APPLIED = [
    "clean",
    "orchestrator.algo.type",
    "orchestrator.train.source.0.name",
    "orchestrator.train.source.0.env.taskset.id",
    "orchestrator.renderer.name",
    "log.level",
]


def test_current_prime_rl_keys_land_on_fields_or_are_named_as_not_supported(tmp_path: Path):
    config, notes = load_train_config(write(tmp_path / "rl.toml", CURRENT))
    assert (config.loss, config.dppo_mask_low, config.dppo_mask_high, config.kl_tau) == (
        "dppo",
        0.1,
        0.2,
        0.002,
    )
    assert (config.rollouts_per_example, config.max_off_policy_steps, config.max_async_level) == (4, 3, 1)
    assert (config.sampling.max_tokens, config.sampling.temperature) == (64, 0.9)
    assert (config.wandb.project, config.wandb.name, config.run_name) == (
        "reverse-text",
        "rt-dppo",
        "rt-current",
    )
    shown = [note for note in notes if note.startswith("not supported here: ")]
    assert [note.split(" = ")[0].removeprefix("not supported here: ") for note in shown] == NOT_APPLIED


def test_the_dry_run_lists_each_key_it_does_not_apply_and_can_start(tmp_path: Path):
    result = workbench("train", str(write(tmp_path / "rl.toml", CURRENT)), "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # rich may fold a long note
    for key in NOT_APPLIED:
        assert f"not supported here: {key} = " in out, key
    assert 'orchestrator.algo.type = "grpo" (workbench\'s algorithm is `mode` and `loss`' in out
    assert (
        "dppo (prime-rl's default) · tokens masked when p - mu > 0.2 (A > 0) or mu - p > 0.1 (A <= 0)" in out
    )


@pytest.mark.parametrize("prefix", sorted(UNSUPPORTED))
def test_every_unsupported_key_is_named_not_dropped(prefix: str):
    *tables, leaf = prefix.split(".")
    raw: dict = {"orchestrator": {"batch_size": 8}}
    node = raw
    for table in tables:
        node = node.setdefault(table, {})
    node[leaf] = "x"
    translation = translate(raw)
    assert translation.unknown is None
    assert translation.unsupported == [prefix]
    assert any(note.startswith(f'not supported here: {prefix} = "x" (') for note in translation.notes)


@pytest.mark.parametrize("value", ["custom", "ipo"])
def test_a_loss_type_workbench_has_not_is_named_and_the_default_loss_kept(value: str):
    translation = translate({"trainer": {"loss": {"type": value}}})
    assert translation.unsupported == ["trainer.loss.type"] and "loss" not in translation.data


def test_a_misspelt_key_in_those_tables_is_still_an_error(tmp_path: Path):
    path = write(tmp_path / "rl.toml", "[orchestrator]\nbatch_size = 8\n[trainer.loss]\nkl_taux = 0.1\n")
    one_line_error(
        workbench("train", str(path), "--dry-run", cwd=tmp_path),
        "rl.toml:4: unknown key 'trainer.loss.kl_taux' (did you mean 'trainer.loss.kl_tau'?)",
    )


def test_max_async_level_still_works_beside_max_off_policy_steps(tmp_path: Path):
    """An older config's max_async_level keeps its meaning (how far generation runs ahead), under
    its own name or prime-rl's older [trainer] one; max_off_policy_steps is the staleness bound."""
    server = (
        '[inference]\nmode = "server"\nbase_urls = ["http://127.0.0.1:9/v1"]\n[[env]]\nid = "reverse-text"\n'
    )
    config, _ = load_train_config(write(tmp_path / "a.toml", "max_async_level = 2\n" + server))
    assert (config.max_async_level, config.max_off_policy_steps) == (2, 8)
    assert async_text(config).startswith(
        "max_async_level 2: generation runs up to 2 step(s) ahead of training"
    )
    assert "max_off_policy_steps 8: groups more than 8 step(s) stale when trained are dropped" in async_text(
        config
    )
    nested, _ = load_train_config(write(tmp_path / "b.toml", "[trainer]\nmax_async_level = 0\n" + server))
    assert nested.max_async_level == 0 and async_text(nested).startswith("synchronous")
    tight, _ = load_train_config(
        write(tmp_path / "c.toml", "max_async_level = 2\nmax_off_policy_steps = 1\n" + server)
    )
    assert "every batch generated ahead is regenerated" in async_text(tight)
    colocated, _ = load_train_config(
        write(tmp_path / "d.toml", 'max_async_level = 3\n[[env]]\nid = "reverse-text"\n')
    )
    assert async_text(colocated).startswith("on-policy: colocated generation uses the current weights")
