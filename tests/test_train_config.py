"""Training config: every documented style loads and dry-runs, translations land on the right
canonical values, mistakes are one clear line, --set overrides, env_file secrets stay secret."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli
from tests.conftest import FIXTURES
from workbench.errors import UserError
from workbench.train.config import (
    TrainConfig,
    apply_overrides,
    config_for_saving,
    load_env_files,
    load_train_config,
    parse_override_value,
    run_blockers,
    save_resolved_config,
)
from workbench.train.plan import build_plan, machine_notes
from workbench.train.translate import translate

SEEDS = FIXTURES / "seed-configs"

# file -> (model in the plan, env ids in the plan)
SEED_PLANS = {
    "hosted-basic.toml": ("Qwen/Qwen3-30B-A3B-Instruct-2507", ["my-environment"]),
    "hosted-reference.toml": ("Qwen/Qwen3-30B-A3B-Instruct-2507", ["primeintellect/alphabet-sort"]),
    "multi-env.toml": ("Qwen/Qwen3-4B-Instruct-2507", ["gsm8k", "math-python", "reverse-text"]),
    "prime-rl-docs.toml": ("Qwen/Qwen3-4B-Instruct-2507", ["primeintellect/wiki-search"]),
    "prime-rl-flat.toml": ("Qwen/Qwen3-30B-A3B-Instruct-2507", ["wiki-search"]),
    "prime-rl-nested-full.toml": ("Qwen/Qwen2.5-7B-Instruct", ["my-env"]),
    "prime-rl-nested.toml": ("Qwen/Qwen3-4B-Instruct-2507", ["primeintellect/wiki-search"]),
    "prime-rl-options.toml": ("tiny", ["reverse-text"]),
    "prime-rl-seed004.toml": ("Qwen/Qwen3-4B", ["alphabet-sort"]),
    "vf-rl.toml": ("Qwen/Qwen3-4B-Instruct-2507", ["primeintellect/wiki-search"]),
}


def workbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WORKBENCH_WORKSPACE", "WANDB_API_KEY", "OPENAI_API_KEY")
    }
    env["COLUMNS"] = "200"  # rich wraps at 80 columns without a terminal
    env["HF_HUB_OFFLINE"] = (
        "1"  # the same answers with or without a network: hub ids unchecked, gsm8k not cached
    )
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# Seed configs that name what is not here (a placeholder env, a missing env_file): the dry run
# prints the whole plan, then one line naming what is missing, and exits 1 (seed-configs/README).
# Environments are loaded as the run would: wiki-search with a judge_model on the OpenAI API needs
# its key. (gsm8k and math-python load offline: GSM8K ships with the gsm8k environment.)
BLOCKED_SEEDS = {
    "hosted-basic.toml": "unknown environment 'my-environment'",
    "hosted-reference.toml": "secrets.env' does not exist",
    "prime-rl-nested-full.toml": "unknown environment 'my-env'",
    "prime-rl-flat.toml": "judge model 'gpt-4.1-mini' on the OpenAI API needs an API key",
}


def test_every_seed_config_is_covered():
    assert sorted(p.name for p in SEEDS.glob("*.toml")) == sorted([*SEED_PLANS, "gepa.toml"])


@pytest.mark.parametrize("name", list(SEED_PLANS))
def test_seed_config_dry_run_prints_the_plan(name: str, tmp_path: Path):
    result = workbench("train", str(SEEDS / name), "--dry-run", cwd=tmp_path)
    assert "unknown key" not in result.stderr
    if name in BLOCKED_SEEDS:
        one_line_error(result, name, "a real run cannot start", BLOCKED_SEEDS[name])
    else:
        assert result.returncode == 0, result.stderr
    model, env_ids = SEED_PLANS[name]
    assert model in result.stdout
    for env_id in env_ids:
        assert env_id in result.stdout
    assert "dry run: config is valid" in result.stdout
    assert not (tmp_path / "outputs").exists()  # a dry run writes nothing


def test_gepa_config_is_pointed_at_gepa(tmp_path: Path):
    one_line_error(
        workbench("train", str(SEEDS / "gepa.toml"), "--dry-run", cwd=tmp_path),
        "gepa.toml",
        "looks like a GEPA config",
        "workbench gepa run",
    )


def test_missing_env_file_is_a_note_in_dry_run_and_an_error_in_a_real_run(tmp_path: Path):
    dry = workbench("train", str(SEEDS / "hosted-reference.toml"), "--dry-run", cwd=tmp_path)
    one_line_error(dry, "secrets.env")
    assert "secrets.env" in dry.stdout and "MISSING" in dry.stdout and "a real run stops here" in dry.stdout
    one_line_error(
        workbench("train", str(SEEDS / "hosted-reference.toml"), cwd=tmp_path),
        "hosted-reference.toml",
        "env_file",
        "secrets.env",
        "does not exist",
    )


def test_prime_rl_nested_translates():
    config, notes = load_train_config(SEEDS / "prime-rl-nested.toml")
    assert config.model == "Qwen/Qwen3-4B-Instruct-2507"
    assert (config.lora.enabled, config.lora.r, config.lora.alpha) == (True, 8, 32)
    assert "gate_proj" in config.lora.target_modules
    assert config.learning_rate == 1e-5 and config.weight_decay == 0.0
    assert (config.batch_size, config.rollouts_per_example) == (512, 16)
    assert config.difficulty_filter.enabled and config.difficulty_filter.oversampling_factor == 2.0
    assert config.sampling.max_tokens == 512 and config.seq_len == 4096
    assert config.zero_truncated_completions and not config.mask_truncated_completions
    assert [e.id for e in config.env] == ["primeintellect/wiki-search"]
    assert config.inference.gpu_ids == [0] and config.trainer_gpu_ids == [1]
    assert config.inference.tool_call_parser == "hermes" and config.inference.enable_auto_tool_choice
    assert any("prime-rl nested" in n for n in notes)


def test_prime_rl_nested_full_translates():
    config, _ = load_train_config(SEEDS / "prime-rl-nested-full.toml")
    assert config.model == "Qwen/Qwen2.5-7B-Instruct" and config.tokenizer == "Qwen/Qwen2.5-7B-Instruct"
    assert config.activation_checkpointing
    assert (config.lora.r, config.lora.alpha, config.lora.dropout) == (32, 32, 0.05)
    assert (config.batch_size, config.rollouts_per_example, config.seq_len) == (32, 16, 16384)
    assert config.difficulty_filter.enabled
    assert (config.sampling.max_tokens, config.sampling.temperature) == (1024, 0.5)
    assert config.env[0].args == {"dataset_name": "train", "difficulty": "hard"}
    i = config.inference
    assert (i.gpu_memory_utilization, i.model, i.max_model_len, i.gpu_ids) == (
        0.6,
        "Qwen/Qwen2.5-7B-Instruct",
        16384,
        [0, 1, 2],
    )


def test_prime_rl_flat_and_options_translate():
    flat, _ = load_train_config(SEEDS / "prime-rl-flat.toml")
    assert flat.model == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert flat.num_gpus == 8 and flat.inference.tensor_parallel_size == 4
    assert flat.env[0].id == "wiki-search" and flat.env[0].args["judge_model"] == "gpt-4.1-mini"
    assert flat.sampling.max_tokens == 1024
    options, notes = load_train_config(SEEDS / "prime-rl-options.toml")
    assert (options.lora.enabled, options.lora.r, options.lora.alpha) == (True, 64, 128)
    assert options.difficulty_filter.enabled and options.difficulty_filter.min_reward_variance == 0.3
    # written after [sampling], so TOML nests them there; they are read as the top-level keys
    assert options.num_gpus == 8 and options.inference.tensor_parallel_size == 4
    assert options.sampling.top_p == 0.9
    assert options.model == "tiny" and [e.id for e in options.env] == ["reverse-text"]
    assert any("num_gpus" in n and "[sampling]" in n for n in notes)
    assert any("prime-rl's default" in n for n in notes)


def test_vf_rl_translates():
    config, _ = load_train_config(SEEDS / "vf-rl.toml")
    assert config.model == "Qwen/Qwen3-4B-Instruct-2507" and config.run_name == "wiki-search"
    assert (config.micro_batch_size, config.batch_size, config.rollouts_per_example) == (4, 1024, 16)
    assert config.gradient_accumulation_steps == 256
    assert config.max_steps == 500 and config.sampling.max_tokens == 512 and config.seq_len == 4096
    assert config.env[0].id == "primeintellect/wiki-search" and config.env[0].args == {"max_turns": 10}
    assert config.inference.gpu_ids == [0] and config.trainer_gpu_ids == [1] and config.num_gpus == 2
    assert config.inference.tool_call_parser == "hermes"


def test_prime_rl_seed004_translates_every_key():
    config, notes = load_train_config(SEEDS / "prime-rl-seed004.toml")
    assert (config.optimization_dtype, config.reduce_dtype) == ("bfloat16", "bfloat16")
    assert config.inference.dtype == "float16" and config.inference.reasoning_parser == "qwen3"
    ck = config.checkpointing
    assert (ck.save_every_n_steps, ck.keep_n_checkpoints, ck.keep_every_n_steps) == (10, 3, 50)
    e = config.eval
    assert (e.interval, e.rollouts_per_example, e.num_examples) == (100, 1, 100)
    assert [(env.id, env.args) for env in e.env] == [("alphabet-sort", {"num_eval_examples": 100})]
    assert [env.id for env in config.env] == ["alphabet-sort"] and config.trajectory_strategy == "branching"
    assert config.activation_checkpointing and (config.lora.r, config.lora.dropout) == (32, 0.05)
    assert run_blockers(config) == []
    plan = build_plan(config, notes, [], gpu_count=0)
    rows = {label: value for section in plan.sections for label, value in section.rows}
    assert "multiple of 50, permanently" in rows["checkpoints"] and "keep newest 3" in rows["checkpoints"]
    assert "alphabet-sort (num_eval_examples=100)" in rows["eval"] and "every 100 steps" in rows["eval"]
    assert "dtype float16" in rows["inference settings"] and "optimization bfloat16" in rows["dtype"]
    cpu = "\n".join(plan.notes)
    assert "reduce_dtype = 'bfloat16' has no effect on this machine" in cpu
    assert "inference.dtype = 'float16' has no effect here: it sets the weights of launched servers" in cpu
    # LoRA on a CPU with native bfloat16 matmuls holds its frozen base weights in bfloat16; elsewhere it is float32
    from workbench.inference.cpu_features import cpu_has_bf16

    expected = (
        "LoRA's frozen base weights are held in bfloat16"
        if cpu_has_bf16()
        else "optimization_dtype = 'bfloat16' has no effect on this machine"
    )
    assert expected in cpu


def test_autocast_on_a_cpu_without_native_bfloat16_says_it_has_no_effect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = TrainConfig(env=[{"id": "reverse-text"}], autocast_dtype="bfloat16")
    monkeypatch.setattr("workbench.train.plan.cpu_has_bf16", lambda: False)
    notes = "\n".join(machine_notes(config, gpu_count=0))
    assert "autocast_dtype = 'bfloat16' has no effect on this machine" in notes
    monkeypatch.setattr("workbench.train.plan.cpu_has_bf16", lambda: True)
    assert "autocast_dtype" not in "\n".join(machine_notes(config, gpu_count=0))


def test_replica_bfloat16_on_a_cpu_without_native_bfloat16_says_float32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = TrainConfig(
        env=[{"id": "reverse-text"}], inference={"mode": "server", "launch": True, "dtype": "bfloat16"}
    )
    monkeypatch.setattr("workbench.inference.cpu_features.cpu_has_bf16", lambda: False)
    notes = "\n".join(machine_notes(config, gpu_count=0))
    assert "replicas run float32 on this machine" in notes
    monkeypatch.setattr("workbench.inference.cpu_features.cpu_has_bf16", lambda: True)
    assert "replicas run float32" not in "\n".join(machine_notes(config, gpu_count=0))


def test_dtype_notes_on_a_gpu_machine():
    colocated = TrainConfig(
        env=[{"id": "reverse-text"}],
        optimization_dtype="bfloat16",
        reduce_dtype="bfloat16",
        inference={"dtype": "bfloat16"},
    )
    notes = "\n".join(machine_notes(colocated, gpu_count=2))
    assert "optimization_dtype = 'bfloat16': trainer processes on a CUDA GPU" in notes
    assert "reduce_dtype = 'bfloat16' is not applied on its own" in notes
    assert "inference.dtype configure" in notes and "inference.mode = 'colocated'" in notes
    remote = TrainConfig(
        env=[{"id": "reverse-text"}],
        inference={"dtype": "float16", "mode": "server", "base_urls": ["http://h:8000/v1"]},
    )
    assert any(
        "inference.dtype = 'float16' configures a launched vLLM" in n
        for n in machine_notes(remote, gpu_count=1)
    )
    assert (
        machine_notes(TrainConfig(env=[{"id": "reverse-text"}]), gpu_count=0) == []
    )  # the defaults say nothing


@pytest.mark.parametrize("prefix", ["trainer.ckpt", "ckpt"])
def test_checkpoint_and_eval_keys_translate(prefix: str):
    raw = {
        "model": {"name": "tiny"},
        "orchestrator": {
            "env": [{"id": "reverse-text"}],
            "eval": {"interval": 5, "num_examples": 8, "env": {"id": "alphabet-sort"}},
        },
    }
    *parents, leaf = prefix.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = {"interval": 4, "keep_last": 2, "keep_interval": 20}
    data = translate(raw).data
    assert data["checkpointing"] == {
        "save_every_n_steps": 4,
        "keep_n_checkpoints": 2,
        "keep_every_n_steps": 20,
    }
    assert data["eval"] == {
        "interval": 5,
        "num_examples": 8,
        "env": [{"id": "alphabet-sort"}],
    }  # one table: a list of one
    config = TrainConfig.model_validate(data)
    assert config.eval.env[0].id == "alphabet-sort" and config.checkpointing.keep_every_n_steps == 20
    hosted = translate(
        {"env": [{"id": "reverse-text"}], "eval": {"interval": 5, "env": {"id": "gsm8k"}}}
    ).data  # [eval.env]
    assert hosted["eval"]["env"] == [{"id": "gsm8k"}]


def test_new_keys_point_at_the_file_line_when_wrong(tmp_path: Path):
    base = '[model]\nname = "tiny"\n\n[[orchestrator.env]]\nid = "reverse-text"\n\n'
    typo = write(tmp_path / "t.toml", base + "[trainer.ckpt]\ninterval = 5\nkeep_intervall = 50\n")
    with pytest.raises(
        UserError,
        match=r"t.toml:9: unknown key 'trainer.ckpt.keep_intervall' \(did you mean 'trainer.ckpt.keep_interval'\?\)",
    ):
        load_train_config(typo)
    dtype = write(tmp_path / "d.toml", base + '[trainer.model]\noptimization_dtype = "float16"\n')
    with pytest.raises(
        UserError,
        match=r"d.toml:8: key 'trainer.model.optimization_dtype': Input should be 'bfloat16' or 'float32'",
    ):
        load_train_config(dtype)
    twice = write(tmp_path / "c.toml", base + "[ckpt]\ninterval = 5\n[trainer.ckpt]\ninterval = 10\n")
    with pytest.raises(UserError, match="already sets"):
        load_train_config(twice)


def test_unknown_eval_env_blocks_a_real_run(tmp_path: Path):
    config = TrainConfig(
        env=[{"id": "reverse-text"}],
        eval={"interval": 2, "env": [{"id": "reverse-text"}, {"id": "no-such-env"}]},
    )
    assert [p.split(" (")[0] for p in run_blockers(config)] == ["eval.env: unknown environment 'no-such-env'"]
    toml = write(
        tmp_path / "e.toml",
        '[[env]]\nid = "reverse-text"\n[eval]\ninterval = 2\n[[eval.env]]\nid = "no-such-env"\n',
    )
    result = workbench("train", str(toml), "--dry-run", cwd=tmp_path)
    one_line_error(result, "a real run cannot start", "eval.env: unknown environment 'no-such-env'")
    assert "envs no-such-env (no args)" in result.stdout


def test_pruning_keeps_every_multiple_of_keep_every(tmp_path: Path):
    from workbench.store.checkpoints import CHECKPOINTS, STATE_JSON, list_checkpoints, step_dir_name
    from workbench.train.checkpoint import prune_checkpoints

    def save(step: int) -> None:
        folder = tmp_path / CHECKPOINTS / step_dir_name(step)
        folder.mkdir(parents=True)
        (folder / STATE_JSON).write_text("{}")

    steps = lambda: [int(p.name.split("_")[1]) for p in list_checkpoints(tmp_path)]
    for step in range(10, 130, 10):  # save every 10 steps, keep the newest 3 and every 50th step
        save(step)
        prune_checkpoints(tmp_path, keep=3, keep_every=50)
    assert steps() == [50, 100, 110, 120]
    save(125)  # a final step off the interval
    prune_checkpoints(tmp_path, keep=3, keep_every=50)
    assert steps() == [50, 100, 110, 120, 125]  # 100 left the newest 3 but is kept for good
    prune_checkpoints(tmp_path, keep=2, keep_every=None)
    assert steps() == [120, 125]
    prune_checkpoints(tmp_path, keep=0, keep_every=7)  # 0 keeps all
    assert steps() == [120, 125]


def test_docs_style_and_hosted_reference():
    docs, _ = load_train_config(SEEDS / "prime-rl-docs.toml")
    # gradient_accumulation_steps = 1 without micro_batch_size: the whole batch in one pass
    assert (docs.gradient_accumulation_steps, docs.micro_batch_size) == (1, 256)
    assert (docs.lora.r, docs.lora.alpha, docs.lora.dropout) == (64, 16, 0.05)
    assert docs.kl_penalty.enabled and docs.kl_penalty.target_kl == 0.01 and docs.kl_penalty.beta == 0.1
    assert docs.difficulty_filter.max_reward == 0.95 and docs.sampling.stop == ["<|endoftext|>"]
    assert docs.wandb.entity == "my-team"
    ref, notes = load_train_config(SEEDS / "hosted-reference.toml")
    # env_file follows [wandb] in the file, so TOML reads wandb.env_file: it is the top-level key
    assert ref.env_file == [str(SEEDS / "secrets.env")]
    assert run_blockers(ref) == [f"env_file '{SEEDS / 'secrets.env'}' does not exist"]
    assert any("env_file" in n and "[wandb]" in n for n in notes)


def test_unknown_key_names_file_line_and_closest_key(tmp_path: Path):
    config = write(
        tmp_path / "rt.toml",
        'model = "tiny"\n\n[sampling]\nmax_tokens = 64\ntemprature = 0.5\n\n[[env]]\nid = "reverse-text"\n',
    )
    line = one_line_error(workbench("train", str(config), "--dry-run", cwd=tmp_path))
    assert (
        line == f"error: {config}:5: unknown key 'sampling.temprature' (did you mean 'sampling.temperature'?)"
    )


def test_unknown_key_in_a_translated_table_is_named_as_written(tmp_path: Path):
    nested = write(
        tmp_path / "n.toml",
        '[model]\nname = "tiny"\n\n[trainer.optim]\nlr = 1e-5\nweight_decy = 0.1\n\n'
        '[[orchestrator.env]]\nid = "reverse-text"\n',
    )
    one_line_error(
        workbench("train", str(nested), "--dry-run", cwd=tmp_path),
        f"{nested}:6:",
        "unknown key 'trainer.optim.weight_decy'",
        "did you mean 'trainer.optim.weight_decay'",
    )
    sampling = write(
        tmp_path / "s.toml",
        '[orchestrator.sampling]\nmax_tokenz = 5\n\n[[orchestrator.env]]\nid = "reverse-text"\n',
    )
    with pytest.raises(
        UserError,
        match=r"s.toml:2: unknown key 'orchestrator.sampling.max_tokenz' \(did you mean 'orchestrator.sampling.max_tokens'\?\)",
    ):
        load_train_config(sampling)
    alias = write(tmp_path / "a.toml", 'lora_rnk = 4\n[[env]]\nid = "reverse-text"\n')
    with pytest.raises(UserError, match=r"a.toml:1: unknown key 'lora_rnk' \(did you mean 'lora_rank'\?\)"):
        load_train_config(alias)


def test_impossible_values_fail_with_one_clear_line(tmp_path: Path):
    config = write(
        tmp_path / "c.toml",
        'max_steps = 5\nbatch_size = 60\nrollouts_per_example = 16\n[[env]]\nid = "reverse-text"\n',
    )
    one_line_error(
        workbench("train", str(config), "--dry-run", cwd=tmp_path),
        f"{config}:2:",
        "batch_size (60) must be divisible by rollouts_per_example (16)",
    )
    cases = {
        "micro_batch_size=5": "batch_size (64) must be divisible by micro_batch_size (5)",
        "micro_batch_size=128": "micro_batch_size (128) is larger than batch_size (64)",
        "gradient_accumulation_steps=3": "batch_size (64) must be divisible by gradient_accumulation_steps (3)",
        "learning_rate=-1e-4": "key 'learning_rate': Input should be greater than or equal to 0",
        "env=[]": "rl training needs at least one [[env]]",
        "rollouts_per_example=1": "at least 2",
        "mode='sft'": "needs sft.data_path",
        "inference.mode='server'": "needs inference.base_urls or inference.launch",
    }
    for override, message in cases.items():
        with pytest.raises(
            UserError, match="^--set .*" + message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
        ):
            load_train_config(config, ["batch_size=64", override])
    with pytest.raises(
        UserError,
        match=r"gradient_accumulation_steps \(3\) disagrees with batch_size / micro_batch_size \(64 / 8 = 8\)",
    ):
        load_train_config(config, ["batch_size=64", "micro_batch_size=8", "gradient_accumulation_steps=3"])


def test_micro_batches_are_derived_when_not_given(tmp_path: Path):
    config = write(
        tmp_path / "c.toml", 'batch_size = 24\nrollouts_per_example = 4\n[[env]]\nid = "reverse-text"\n'
    )
    loaded, _ = load_train_config(config)
    assert (loaded.micro_batch_size, loaded.gradient_accumulation_steps) == (12, 2)
    loaded, _ = load_train_config(config, ["gradient_accumulation_steps=6"])
    assert (loaded.micro_batch_size, loaded.gradient_accumulation_steps) == (4, 6)


def test_set_overrides(tmp_path: Path):
    config = write(
        tmp_path / "c.toml",
        'max_steps = 5\nbatch_size = 16\nrollouts_per_example = 4\n[[env]]\nid = "reverse-text"\n',
    )
    loaded, notes = load_train_config(
        config,
        [
            "max_steps=20",
            "sampling.temperature=0.8",
            "lora.enabled=false",
            'sampling.stop=["</a>"]',
            "run_name=123",
            "env.0.args.max_turns=3",
            "env.1.id=alphabet-sort",
            "model=Qwen/Qwen3-4B",
        ],
    )
    assert loaded.max_steps == 20 and loaded.sampling.temperature == 0.8 and loaded.lora.enabled is False
    assert loaded.sampling.stop == ["</a>"] and loaded.run_name == "123" and loaded.model == "Qwen/Qwen3-4B"
    assert loaded.env[0].args == {"max_turns": 3} and loaded.env[1].id == "alphabet-sort"
    assert any("max_steps=20" in n for n in notes)
    result = workbench(
        "train",
        str(config),
        "--dry-run",
        "--set",
        "max_steps=7",
        "--set",
        "sampling.max_tokens=33",
        cwd=tmp_path,
    )
    assert result.returncode == 0 and "max_tokens 33" in result.stdout, result.stderr
    one_line_error(
        workbench("train", str(config), "--dry-run", "--set", "sampling.temprature=0.8", cwd=tmp_path),
        "--set sampling.temprature: unknown key 'sampling.temprature' (did you mean 'sampling.temperature'?)",
    )
    one_line_error(
        workbench("train", str(config), "--dry-run", "--set", "max_stepz=3", cwd=tmp_path),
        "unknown key 'max_stepz' (did you mean 'max_steps'?)",
    )
    for bad, message in {
        "max_steps": "expects KEY=VALUE",
        "max_steps.x=1": "'max_steps' is a value",
        "env.id=x": "'env' is a list",
    }.items():
        with pytest.raises(UserError, match=message):
            apply_overrides({"max_steps": 5, "env": [{"id": "a"}]}, [bad])


def test_override_values_parse_as_toml_or_string():
    assert parse_override_value("20") == 20
    assert parse_override_value("0.8") == 0.8
    assert parse_override_value("false") is False
    assert parse_override_value('["</a>", "x"]') == ["</a>", "x"]
    assert parse_override_value("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    assert parse_override_value("2024-01-01") == "2024-01-01"  # a run name, not a date


def test_env_file_loads_into_environment_and_is_never_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("WB_TEST_SECRET", raising=False)
    monkeypatch.setenv("WB_TEST_PRESET", "from-shell")
    (tmp_path / "conf").mkdir()
    write(
        tmp_path / "conf" / "secrets.env",
        "WB_TEST_SECRET=hunter2-value\nWB_TEST_PRESET=from-file\n# comment\n",
    )
    config_file = write(
        tmp_path / "conf" / "train.toml",
        'env_file = ["secrets.env"]\nmax_steps = 3\nbatch_size = 8\n'
        'rollouts_per_example = 4\n[[env]]\nid = "reverse-text"\n',
    )
    monkeypatch.chdir(tmp_path)  # relative to the config file, not the current directory
    config, _ = load_train_config(config_file)
    assert run_blockers(config) == []
    loaded = load_env_files(config, config_file)
    assert os.environ["WB_TEST_SECRET"] == "hunter2-value"
    assert loaded == ["WB_TEST_SECRET"] and os.environ["WB_TEST_PRESET"] == "from-shell"  # the shell wins
    saved = save_resolved_config(config, tmp_path / "run")
    text = saved.read_text()
    assert "hunter2" not in text and "from-file" not in text and "secrets.env" in text
    assert text.splitlines()[0] == f"# workbench train --resume {tmp_path / 'run'}"
    assert "hunter2" not in str(config_for_saving(config))


def test_missing_env_file_fails_when_loading(tmp_path: Path):
    config = TrainConfig.model_validate({"env": [{"id": "reverse-text"}], "env_file": ["nope.env"]})
    with pytest.raises(UserError, match="env_file 'nope.env' does not exist"):
        load_env_files(config, tmp_path / "train.toml")


def test_saved_config_loads_back_identically_and_resumes(tmp_path: Path):
    original, _ = load_train_config(SEEDS / "prime-rl-nested-full.toml")
    save_resolved_config(original, tmp_path / "run")
    again, _ = load_train_config(tmp_path / "run" / "config.toml")
    assert again == original
    result = workbench(
        "train", "--resume", str(tmp_path / "run"), "--dry-run", "--set", "max_steps=600", cwd=tmp_path
    )
    one_line_error(
        result, "unknown environment 'my-env'"
    )  # the seed's placeholder env: the plan, then exit 1
    assert "600" in result.stdout
    one_line_error(
        workbench("train", str(SEEDS / "vf-rl.toml"), "--resume", str(tmp_path / "run"), cwd=tmp_path),
        "drop CONFIG",
    )
    one_line_error(workbench("train", "--resume", str(tmp_path), cwd=tmp_path), "not a training run folder")
    one_line_error(workbench("train", cwd=tmp_path), "give a training config")


def test_keys_that_cannot_apply_here_are_named():
    config, _ = load_train_config(SEEDS / "prime-rl-nested-full.toml")
    cpu = "\n".join(machine_notes(config, gpu_count=0))
    for key in ("trainer_gpu_ids", "inference.gpu_ids", "inference.gpu_memory_utilization"):
        assert key in cpu
    one_gpu = "\n".join(machine_notes(config, gpu_count=1))
    assert "trainer_gpu_ids = [3]" in one_gpu and "[1, 2]" in one_gpu
    plan = build_plan(config, [], run_blockers(config), gpu_count=0)
    assert any("trainer_gpu_ids" in n for n in plan.notes)
    rows = {label: value for section in plan.sections for label, value in section.rows}
    assert rows["per step"] == "32 rollouts = 2 examples x 16 rollouts_per_example"


def test_every_field_is_documented():
    def check(model: type) -> None:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            annotation = field.annotation
            for inner in (annotation, *getattr(annotation, "__args__", ())):
                if isinstance(inner, type) and hasattr(inner, "model_fields"):
                    check(inner)

    check(TrainConfig)


def test_translation_is_pure_and_leaves_canonical_configs_alone():
    raw = {"model": "tiny", "batch_size": 8, "env": [{"id": "reverse-text"}], "sampling": {"max_tokens": 9}}
    result = translate(raw)
    assert result.data == raw and result.style == "hosted" and result.notes == []
    nested = {"model": {"name": "m"}, "orchestrator": {"batch_size": 8}}
    translate(nested)
    assert nested == {"model": {"name": "m"}, "orchestrator": {"batch_size": 8}}  # input untouched


def test_config_modules_do_not_import_torch():
    code = (
        "import sys, workbench.cli.main, workbench.train, workbench.train.config, workbench.train.plan;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


LAUNCH = """model = "Qwen/Qwen3-0.6B"
batch_size = 8
rollouts_per_example = 4
[[env]]
id = "reverse-text"
[inference]
mode = "server"
launch = true
tensor_parallel_size = 2
gpu_ids = [0, 1]
"""


def test_launch_shows_the_vllm_command_and_needs_vllm_with_a_gpu(tmp_path: Path):
    config = write(tmp_path / "launch.toml", LAUNCH)
    dry = workbench("train", str(config), "--dry-run", cwd=tmp_path)
    one_line_error(
        dry, "a real run cannot start", "inference.launch needs vLLM"
    )  # the whole plan, then exit 1
    assert (
        "vllm" in dry.stdout
        and "serve Qwen/Qwen3-0.6B" in dry.stdout
        and "--tensor-parallel-size 2" in dry.stdout
    )
    assert "CUDA_VISIBLE_DEVICES=0,1" in dry.stdout and "--enable-lora" in dry.stdout
    one_line_error(
        workbench("train", str(config), cwd=tmp_path), "inference.launch needs vLLM on a machine with a GPU"
    )
    colocated = write(tmp_path / "bad.toml", LAUNCH.replace('mode = "server"', 'mode = "colocated"'))
    one_line_error(
        workbench("train", str(colocated), cwd=tmp_path), "launch", "needs inference.mode = 'server'"
    )


def test_more_ranks_than_groups_is_one_line(tmp_path: Path):
    """`--nproc` larger than a step's groups (issue 34's bad input): refused by the dry run and the
    run alike, before any process starts."""
    from tests.test_eval_run import run_cli

    config = tmp_path / "rl.toml"
    config.write_text(
        'model = "tiny"\nbatch_size = 8\nrollouts_per_example = 4\nmicro_batch_size = 4\n[[env]]\nid = "reverse-text"\n'
    )
    for extra in (["--dry-run"], []):
        done = run_cli("train", str(config), "--nproc", "3", *extra, cwd=tmp_path)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert done.returncode == 1 and len(errors) == 1, done.stderr
        assert "--nproc 3 is more than the 2 group(s) of a step" in errors[0]
