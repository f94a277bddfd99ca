"""Every training key the product docs and seed configs show is accepted, lands on a schema field,
and does what it says: learning-rate schedules, min_p / repetition_penalty, bf16, FSDP CPU
offload, resume from a chosen step, and the docs' metric names."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.conftest import FIXTURES
from workbench.train.config import TrainConfig, config_for_saving, load_train_config
from workbench.train.metrics import with_aliases
from workbench.train.optimize import lr_factor
from workbench.train.plan import build_plan, machine_notes
from workbench.train.translate import translate

DOCS, SEEDS = FIXTURES / "product-docs", FIXTURES / "seed-configs"

# Keys the docs give in prose or on a command line rather than in a ```toml block.
PROSE_SNIPPETS = {
    "004: fsdp_cpu_offload = true under [trainer.model]": {"trainer": {"model": {"fsdp_cpu_offload": True}}},
    "004: --trainer.ckpt.resume-step 50": {"trainer": {"ckpt": {"resume_step": 50}}},
    "002: [orchestrator.sampling] generation parameters": {
        "orchestrator": {
            "sampling": {
                "max_tokens": 512,
                "temperature": 1.0,
                "top_p": 0.9,
                "top_k": 50,
                "min_p": 0.05,
                "repetition_penalty": 1.1,
            }
        }
    },
    "002: [trainer.args] generation and schedule fields": {
        "trainer": {
            "args": {
                "rollouts_per_example": 8,
                "micro_batch_size": 4,
                "batch_size": 64,
                "max_tokens": 256,
                "temperature": 1.0,
                "top_p": 0.95,
                "top_k": 20,
                "min_p": 0.05,
                "repetition_penalty": 1.05,
                "learning_rate": 1e-5,
                "lr_scheduler_type": "cosine",
                "warmup_steps": 10,
                "max_steps": 100,
                "max_grad_norm": 0.5,
                "bf16": True,
                "gradient_checkpointing": True,
            }
        }
    },
}


def doc_snippets() -> dict[str, dict[str, Any]]:
    """Every ```toml block of the docs (the GEPA one is a GEPA config), plus PROSE_SNIPPETS."""
    found: dict[str, dict[str, Any]] = {}
    for doc in sorted(DOCS.glob("*.txt")):
        for index, block in enumerate(re.findall(r"```toml[^\n]*\n(.*?)```", doc.read_text(), re.S)):
            if "# Wrong" in block:  # 004 shows a wrong spelling, then the right one
                block = block.split("# Right", 1)[1]
            raw = tomllib.loads(block)
            if "reflection_model" not in raw:
                found[f"{doc.name[:3]} block {index}"] = raw
    return {**found, **PROSE_SNIPPETS}


def leaves(raw: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys of every value (an array of tables such as [[env]] is one value)."""
    keys = []
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        keys += leaves(value, dotted + ".") if isinstance(value, dict) and value else [dotted]
    return keys


def canonical(config: TrainConfig, dotted: str) -> bool:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, BaseModel) or part not in type(node).model_fields:
            return False
        node = getattr(node, part)
    return True


def _check_every_key(raw: dict[str, Any]) -> TrainConfig:
    translation = translate(raw)
    assert translation.unknown is None, translation.unknown
    data = translation.data
    if not data.get("env") and data.get("mode", "rl") == "rl":
        data["env"] = [{"id": "reverse-text"}]  # a fragment: add what any run needs
    config = TrainConfig.model_validate(data)
    moved = [src for src, _ in translation.moves]
    for key in leaves(raw):
        assert any(key == src or key.startswith(src + ".") for src in moved) or canonical(config, key), (
            f"{key} was neither translated nor a schema field"
        )
    return config


SNIPPETS = doc_snippets()


def test_the_docs_have_the_snippets_this_file_walks():
    assert len(SNIPPETS) >= 20  # 16 toml blocks (GEPA left out) + the prose ones


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_every_key_the_docs_show_is_accepted(name: str):
    _check_every_key(SNIPPETS[name])


@pytest.mark.parametrize("name", sorted(p.name for p in SEEDS.glob("*.toml") if p.name != "gepa.toml"))
def test_every_key_of_every_seed_config_is_accepted(name: str):
    _check_every_key(tomllib.loads((SEEDS / name).read_text()))


def test_vf_rl_args_land_on_their_fields():
    config = _check_every_key(PROSE_SNIPPETS["002: [trainer.args] generation and schedule fields"])
    assert (config.sampling.min_p, config.sampling.repetition_penalty, config.sampling.top_k) == (
        0.05,
        1.05,
        20,
    )
    assert (config.lr_scheduler, config.warmup_steps, config.max_steps) == ("cosine", 10, 100)
    assert config.optimization_dtype == "bfloat16" and config.activation_checkpointing
    off = _check_every_key(
        {"trainer": {"args": {"bf16": False, "lr_scheduler_type": "constant_with_warmup"}}}
    )
    assert off.optimization_dtype == "float32" and off.lr_scheduler == "constant"


def test_prime_rl_scheduler_and_offload_keys():
    raw = {
        "trainer": {
            "scheduler": {"type": "linear", "warmup_steps": 2, "decay_steps": 5, "min_lr": 1e-6},
            "model": {"fsdp_cpu_offload": True},
            "ckpt": {"resume_step": 4},
        }
    }
    config = _check_every_key(raw)
    assert (config.lr_scheduler, config.lr_decay_steps, config.min_lr, config.warmup_steps) == (
        "linear",
        5,
        1e-6,
        2,
    )
    assert config.fsdp_cpu_offload and config.checkpointing.resume_step == 4
    assert (
        "resume_step" not in config_for_saving(config)["checkpointing"]
    )  # a later --resume takes the newest


def test_unknown_scheduler_is_one_clear_line(tmp_path: Path):
    from workbench.errors import UserError

    path = tmp_path / "bad.toml"
    path.write_text(
        '[trainer.scheduler]\ntype = "exponential"\n\n[[orchestrator.env]]\nid = "reverse-text"\n'
    )
    with pytest.raises(
        UserError, match=r"bad.toml:2: .*trainer.scheduler.type = 'exponential' is not supported"
    ):
        load_train_config(path)


def _lrs(**settings: Any) -> list[float]:
    config = TrainConfig(env=[{"id": "reverse-text"}], learning_rate=1.0, **settings)
    return [lr_factor(step, config) for step in range(config.max_steps)]


def test_learning_rate_schedules():
    assert _lrs(max_steps=4) == [1.0] * 4
    assert _lrs(max_steps=6, warmup_steps=2) == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    # decay starts at the peak after warmup; the last step keeps one decay step above min_lr
    assert _lrs(max_steps=6, warmup_steps=2, lr_scheduler="linear") == pytest.approx(
        [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    )
    cosine = _lrs(max_steps=5, lr_scheduler="cosine", min_lr=0.1)
    assert cosine[0] == pytest.approx(1.0) and all(a > b for a, b in zip(cosine, cosine[1:], strict=False))
    assert cosine[-1] > 0.1 and cosine[2] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.4)))
    wsd = _lrs(max_steps=10, lr_scheduler="linear", lr_decay_steps=4)
    assert wsd[:6] == [1.0] * 6 and wsd[6:] == pytest.approx([1.0, 0.75, 0.5, 0.25])


def test_plan_shows_the_new_settings_and_what_cannot_apply():
    config = TrainConfig(
        env=[{"id": "reverse-text"}],
        lr_scheduler="cosine",
        warmup_steps=3,
        min_lr=1e-6,
        sampling={"min_p": 0.05, "repetition_penalty": 1.1},
        fsdp_cpu_offload=True,
        checkpointing={"resume_step": 20},
    )
    plan = build_plan(config, [], [], gpu_count=0)
    rows = {label: value for section in plan.sections for label, value in section.rows}
    assert (
        rows["learning rate"]
        == "warmup 3 steps, then cosine decay from 0.0005 towards 1e-06 over the remaining steps"
    )
    assert "min_p 0.05" in rows["sampling"] and "repetition_penalty 1.1" in rows["sampling"]
    assert "step 20" in rows["resume"]
    assert any("fsdp_cpu_offload = true has no effect on this machine" in n for n in plan.notes)
    ddp = machine_notes(config, gpu_count=2)
    assert any("data_parallel is 'ddp'" in n for n in ddp)


def test_docs_metric_names_are_logged_beside_ours():
    logged = with_aliases({"reward/mean": 0.5, "policy/kl": 0.01, "train/loss": 1.0})
    assert logged["train/reward"] == 0.5 and logged["train/kl_divergence"] == 0.01
    assert "train/kl_divergence" not in with_aliases({"reward/mean": 0.5})  # no source, no alias


def test_resume_step_needs_the_run_to_resume(tmp_path: Path):
    from tests.test_train_config import one_line_error, workbench

    config = tmp_path / "c.toml"
    config.write_text('model = "tiny"\n[[env]]\nid = "reverse-text"\n[trainer.ckpt]\nresume_step = 5\n')
    one_line_error(
        workbench("train", str(config), "--resume-step", "5", cwd=tmp_path), "--resume-step continues a run"
    )
    one_line_error(workbench("train", str(config), cwd=tmp_path), "resume_step = 5", "--resume RUN")
    one_line_error(
        workbench("train", str(config), "--dry-run", cwd=tmp_path), "a real run cannot start", "--resume RUN"
    )
    assert (
        "from the checkpoint of step 5" in workbench("train", str(config), "--dry-run", cwd=tmp_path).stdout
    )  # still shows the plan


def test_distill_mode_keys_and_mistakes(tmp_path: Path):
    from tests.test_train_config import one_line_error, workbench

    config = _check_every_key(
        {
            "mode": "distill",
            "teacher_model": "tiny",
            "rollouts_per_example": 1,
            "batch_size": 8,
            "env": [{"id": "reverse-text"}],
        }
    )
    assert config.distill.teacher_model == "tiny" and config.on_policy  # pure distillation needs no groups
    rows = {
        label: value
        for section in build_plan(config, [], [], gpu_count=0).sections
        for label, value in section.rows
    }
    assert rows["mode"] == "online distillation" and "reverse KL x 1 (reward not used)" in rows["teacher"]
    with pytest.raises(ValueError, match="rollouts_per_example must be at least 2"):
        TrainConfig(
            mode="distill",
            distill={"teacher_model": "tiny", "reward_weight": 0.5},
            rollouts_per_example=1,
            env=[{"id": "reverse-text"}],
        )
    path = tmp_path / "d.toml"
    path.write_text('mode = "distill"\n[[env]]\nid = "reverse-text"\n')
    one_line_error(
        workbench("train", str(path), "--dry-run", cwd=tmp_path), "d.toml", "distill.teacher_model"
    )
    path.write_text('mode = "distill"\nteacher_model = "./no-such-teacher"\n[[env]]\nid = "reverse-text"\n')
    one_line_error(
        workbench("train", str(path), "--dry-run", cwd=tmp_path),
        "a real run cannot start",
        "distill.teacher_model: no model folder at './no-such-teacher'",
    )
