"""Workspaces for the TUI tests, produced by the project's own code where it can be:

- eval runs: `run_eval` with `EchoClient`-based clients (no model) over two small environments
  written into the workspace as a user would (`environments/<name>/<name>.py`, the env API):
  their data is fixed here, so the pictures do not change when a bundled env's data does;
- a training run: the files `workbench train` writes, written with the project's writers
  (`MetricsLogger`, `RunLog`, `write_json_atomic`; sampled rollouts are real eval records);
- a GEPA run: hand-written files in the layout `workbench.gepa.recorder` writes.

Runs get fixed ids, start times and zeroed timings so screenshots are reproducible.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from workbench.evaluate import EvalConfig, run_eval
from workbench.evaluate.service import RunLog
from workbench.inference.echo import EchoClient
from workbench.store.files import read_json, write_json_atomic
from workbench.store.results import ResultsWriter
from workbench.train.metrics import MetricsLogger
from workbench.types import Completion, Group, Messages, Rollout, RolloutError, SamplingParams

CREATED = "2026-01-02T03:04:05+00:00"

# Workspace environments (module name -> source): a single-turn env with a partial-credit reward,
# and a tool env (one deterministic tool) for conversations with tool calls and tool results.
TEST_ENVS = {
    "reverse_words": '''"""reverse-words: reverse a phrase character by character (single turn, partial credit)."""
from difflib import SequenceMatcher

from workbench.envs import Rubric, SingleTurnEnv, XMLParser

PHRASES = ["bear", "apple river", "stone cloud green", "quiet light", "table paper", "music bread water",
           "night house", "smile", "dance field", "storm ocean tiger", "lemon candle", "forest garden window"]


def lcs_reward(completion, answer, parser) -> float:
    parsed = parser.parse_answer(completion)
    return 0.0 if parsed is None else SequenceMatcher(None, parsed, answer).ratio()


def load_environment():
    parser = XMLParser(["reversed_text"], answer_field="reversed_text")
    rows = [{"question": p, "answer": p[::-1]} for p in PHRASES]
    rubric = Rubric([lcs_reward, parser.get_format_reward_func()], weights=[1.0, 0.0], parser=parser)
    return SingleTurnEnv(dataset=lambda: rows, eval_dataset=lambda: rows, parser=parser, rubric=rubric,
                         system_prompt="Reverse the text character by character. Put your answer in <reversed_text> tags.")
''',
    "lookup_facts": '''"""lookup-facts: answer a question with a lookup tool (tool calls and results)."""
from workbench.envs import Rubric, ToolEnv, XMLParser

FACTS = {"Ada Quill": "Ada Quill (1801-1870) was a glassblower born in Lake Orvin.",
         "Rios Zirus": "Rios Zirus worked for the Tridrea Works, a maker of lenses.",
         "Mel Odrin": "Mel Odrin invented the lumenpress in 1827."}


def lookup(query: str) -> str:
    """Facts about the people named in the query.

    Args:
        query: a question or a name.
    """
    return " ".join(fact for name, fact in FACTS.items() if name in query) or "no match"


def exact_answer(completion, answer, parser) -> float:
    return float((parser.parse_answer(completion) or "").strip() == answer)


def load_environment():
    parser = XMLParser(["answer"], answer_field="answer")
    rows = [{"question": "Where was Ada Quill born?", "answer": "Lake Orvin"},
            {"question": "Who did Rios Zirus work for?", "answer": "Tridrea Works"},
            {"question": "What did Mel Odrin invent?", "answer": "the lumenpress"}]
    return ToolEnv([lookup], dataset=lambda: rows, eval_dataset=lambda: rows, parser=parser,
                   rubric=Rubric([exact_answer], parser=parser), max_turns=3,
                   system_prompt="Answer with the lookup tool. Reply with the answer in <answer> tags.")
''',
}


def install_test_envs(root: Path) -> None:
    """Write the test environments into `root`/environments (idempotent)."""
    for name, source in TEST_ENVS.items():
        folder = root / "environments" / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.py"
        if not path.exists() or path.read_text() != source:
            path.write_text(source)


def _hash(*parts: Any) -> int:
    return int(hashlib.sha256(repr(parts).encode()).hexdigest()[:8], 16)


class VariedClient(EchoClient):
    """Deterministic per rollout (by sampling seed), varied across rollouts: a perfect, a
    partly wrong, an untagged or a truncated answer, or a permanent inference error — so groups
    show variance, zero variance, errors and truncation."""

    async def chat(
        self, messages: Messages, *, sampling: SamplingParams, tools: list[dict[str, Any]] | None = None
    ) -> list[Completion]:
        user = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
        per_example = _hash(user) % 6
        h = _hash(user, sampling.seed)
        target = user[::-1]
        if per_example == 0:  # every rollout right: a too-easy group
            text, finish = f"<reversed_text>{target}</reversed_text>", "stop"
        elif per_example == 1:  # every rollout untagged: a too-hard group
            text, finish = target, "stop"
        elif h % 7 == 0:  # a rollout that failed in the env (a failed model call would be no result at all)
            raise RuntimeError("the env's tool crashed")
        elif h % 7 == 1:
            text, finish = f"<reversed_text>{target[: len(target) // 2]}", "length"
        else:
            keep = len(target) - (h % 4)
            text, finish = f"<reversed_text>{target[:keep]}</reversed_text>", "stop"
        return [
            Completion(
                message={"role": "assistant", "content": text},
                finish_reason=finish,
                prompt_tokens=len(str(messages)) // 4,
                completion_tokens=len(text),
            )
        ]


def normalize_run(run_dir: Path, run_id: str, created_at: str = CREATED) -> Path:
    """Give a run a fixed id and start time, and zero its timings (reproducible screenshots)."""
    target = run_dir.with_name(run_id)
    if target != run_dir:
        shutil.rmtree(target, ignore_errors=True)
        run_dir.rename(target)
    meta = read_json(target / "metadata.json")
    meta.update(run_id=run_id, created_at=created_at, updated_at=created_at)
    meta.pop("elapsed_s", None)
    if isinstance(meta.get("summary"), dict):
        meta["summary"].pop("elapsed_s", None)
    write_json_atomic(target / "metadata.json", meta)
    results = target / "results.jsonl"
    if results.exists():
        lines = []
        for line in results.read_text().splitlines():
            record = json.loads(line)
            record["timing"] = {}
            lines.append(json.dumps(record))
        lines.sort(key=lambda line: (json.loads(line)["example_id"], json.loads(line)["rollout_index"]))
        results.write_text("\n".join(lines) + "\n")
    log = target / "run.log"
    if log.exists():
        log.write_text(
            "".join(f"{created_at} {line.split(' ', 1)[1]}\n" for line in log.read_text().splitlines())
        )
    return target


def make_eval(
    env_id: str,
    client: Any,
    n: int,
    r: int,
    run_id: str,
    model: str = "echo",
    created_at: str = CREATED,
    max_tokens: int | None = None,
) -> Path:
    from workbench.workspace import workspace_root

    install_test_envs(workspace_root())
    config = EvalConfig(
        env_id=env_id,
        model=model,
        num_examples=n,
        rollouts_per_example=r,
        max_concurrent=1,
        max_tokens=max_tokens,
    )
    result = run_eval(config, client=client)
    return normalize_run(result.run_dir, run_id, created_at)


SERVER_FAILED = RolloutError("InferenceError", "503 after retries", where="inference", infrastructure=True)
REWARD_FAILED = RolloutError("ValueError", "reward function 'score' raised: boom", where="reward")


def write_results(
    run_dir: Path,
    rewards_by_example: dict[int, list[float]],
    errors: dict[tuple[int, int], RolloutError] | None = None,
) -> Path:
    """A results.jsonl of hand-picked rewards, written with `ResultsWriter` (one group per example,
    in the given order); `errors` puts an error on (example id, rollout index). Rollout 1 of
    example 2 is truncated. Returns the file."""
    errors = errors or {}
    writer = ResultsWriter(run_dir)
    for example_id, rewards in rewards_by_example.items():
        writer.write_group(
            Group(
                example_id,
                [
                    Rollout(
                        example_id,
                        i,
                        prompt=[{"role": "user", "content": f"q{example_id}"}],
                        completion=[{"role": "assistant", "content": f"a{i}"}],
                        reward=reward,
                        rewards={"score": float(reward)},
                        is_truncated=(example_id, i) == (2, 1),
                        error=errors.get((example_id, i)),
                    )
                    for i, reward in enumerate(rewards)
                ],
            )
        )
    writer.close()
    return run_dir / "results.jsonl"


_KEEPALIVE: list[Any] = []


def keepalive_pid() -> int:
    """The pid of a idle child process that lives as long as the test session: what a 'running'
    fixture run records, so the TUI sees it alive — and a stray Ctrl-C from a test (x: stop)
    lands on it, never on pytest itself."""
    import atexit
    import subprocess
    import sys

    if not _KEEPALIVE or _KEEPALIVE[0].poll() is not None:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(60)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _KEEPALIVE[:] = [proc]
        atexit.register(proc.kill)
    return _KEEPALIVE[0].pid


def make_train_run(
    root: Path,
    name: str = "reverse-words--tiny--20260102-030405-abcd",
    *,
    steps: int = 6,
    max_steps: int = 10,
    status: str = "running",
    pid: int | None = None,
    rollouts_from: Path | None = None,
) -> Path:
    """A training run folder as `workbench train` leaves it mid-run (status `running` with a live
    pid, `keepalive_pid()`, by default), with `steps` metric lines, sampled rollouts per step and two checkpoints."""
    run_dir = root / "outputs" / "runs" / name
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(
        f'model = "tiny"\nmax_steps = {max_steps}\n[[env]]\nid = "reverse-words"\n'
    )
    log = RunLog(run_dir / "run.log")
    log.write("start pid=1234")
    wandb = SimpleNamespace(mode="disabled", project=None, name=None, entity=None)
    logger = MetricsLogger(run_dir, wandb, name, {}, resume=False)
    for step in range(1, steps + 1):
        metrics = train_metrics(step)
        logger.log(step, metrics)
        log.write(
            f"step {step}/{max_steps}  reward {metrics['reward/mean']:.4g}  loss {metrics['train/loss']:.4g}"
        )
        if rollouts_from is not None:
            (run_dir / "rollouts").mkdir(exist_ok=True)
            shutil.copy(rollouts_from / "results.jsonl", run_dir / "rollouts" / f"step_{step}.jsonl")
        if step % 3 == 0:
            write_checkpoint(run_dir, step, metrics["reward/mean"])
    logger.close()
    _normalize_log(run_dir / "run.log")
    write_json_atomic(
        run_dir / "metadata.json",
        {
            "kind": "train",
            "run_id": name,
            "model": "tiny",
            "mode": "rl",
            "env_ids": ["reverse-words"],
            "env_id": "reverse-words",
            "max_steps": max_steps,
            "created_at": CREATED,
            "updated_at": CREATED,
            "pid": keepalive_pid() if pid is None else pid,
            "status": status,
            "step": steps,
            "reward_mean": train_metrics(steps)["reward/mean"],
        },
    )
    return run_dir


def _normalize_log(path: Path) -> None:
    path.write_text("".join(f"{CREATED} {line.split(' ', 1)[1]}\n" for line in path.read_text().splitlines()))


def train_metrics(step: int) -> dict[str, float]:
    """Smooth, plausible curves: reward rises, loss and entropy fall."""
    return {
        "reward/mean": 0.2 + 0.05 * step,
        "reward/std": 0.3 - 0.01 * step,
        "reward/lcs_reward": 0.2 + 0.05 * step,
        "train/loss": 0.5 / step,
        "policy/entropy": 1.5 - 0.1 * step,
        "policy/kl": 0.001 * step,
        "policy/mismatch_kl": 2e-4 * step,
        "policy/mismatch_kl_max": 6e-4 * step,
        "rollout/mean_length": 20.0 + step,
        "time/step": 2.0,
        "train/learning_rate": 1e-3,
    }


def write_checkpoint(run_dir: Path, step: int, reward: float) -> Path:
    """A complete checkpoint folder as far as readers are concerned (trainer_state.json last)."""
    path = run_dir / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_model.safetensors").write_bytes(b"\0" * 4096)
    (path / "trainer_state.json").write_text(
        json.dumps(
            {
                "step": step,
                "base_model": "tiny",
                "lora": True,
                "reward_mean": reward,
                "eval_reward_mean": None,
            }
        )
    )
    stamp = 1767323045 + step  # fixed mtime: 2026-01-02 03:04:05 UTC + step seconds
    os.utime(path / "trainer_state.json", (stamp, stamp))
    return path


SEED_PROMPT = "Reverse the text character by character. Put your answer in <reversed_text> tags."
BEST_PROMPT = (
    "Reverse the text character by character, last character first.\n"
    "Keep spaces where they fall. Put only the answer in <reversed_text> tags."
)


def make_gepa_run(root: Path, run_id: str = "20260102-030405-9e9e", status: str = "finished") -> Path:
    """A GEPA run folder in the layout `workbench gepa run` writes."""
    run_dir = root / "environments" / "reverse_words" / "outputs" / "gepa" / "reverse-words--echo" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    candidates = [
        {
            "index": 0,
            "val_score": 0.42,
            "val_examples": 4,
            "parents": [],
            "discovered_at_calls": 0,
            "prompt": SEED_PROMPT,
        },
        {
            "index": 1,
            "val_score": 0.55,
            "val_examples": 4,
            "parents": [0],
            "discovered_at_calls": 24,
            "prompt": "Reverse the text character by character.\nPut your answer in <reversed_text> tags.",
        },
        {
            "index": 2,
            "val_score": 0.71,
            "val_examples": 4,
            "parents": [1],
            "discovered_at_calls": 48,
            "prompt": BEST_PROMPT,
        },
    ]
    write_json_atomic(
        run_dir / "metadata.json",
        {
            "kind": "gepa",
            "status": status,
            "run_id": run_id,
            "env_id": "reverse-words",
            "model": "echo",
            "created_at": CREATED,
            "updated_at": CREATED,
            "config": {"max_calls": 100},
            "seed_prompt": SEED_PROMPT,
            "seed_score": 0.42,
            "best_score": 0.71,
            "best_candidate": 2,
            "num_candidates": 3,
            "candidates": candidates,
            "metric_calls_used": 72,
            "max_calls": 100,
            "iterations": 3,
        },
    )
    (run_dir / "best_prompt.txt").write_text(BEST_PROMPT + "\n")
    frontier = [
        {"example_id": i, "best_score": s, "candidates": c, "prompts": []}
        for i, s, c in ((0, 1.0, [0, 2]), (1, 0.8, [2]), (2, 0.6, [1, 2]), (3, 0.45, [2]))
    ]
    (run_dir / "pareto_frontier.jsonl").write_text("".join(json.dumps(row) + "\n" for row in frontier))
    return run_dir


@contextlib.contextmanager
def shared_workspace(root: Path) -> Iterator[dict[str, Path]]:
    """`build_workspace` under `root` with $WORKBENCH_WORKSPACE, the current directory and TZ=UTC
    set for as long as the context lasts (for module-scoped fixtures)."""
    import time

    import pytest

    root.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORKBENCH_WORKSPACE", str(root))
        mp.setenv("TZ", "UTC")
        time.tzset()
        mp.chdir(root)
        try:
            yield {"root": root, **build_workspace(root)}
        finally:
            mp.undo()
            time.tzset()


def build_workspace(root: Path) -> dict[str, Path]:
    """Every kind of run the TUI shows. Needs $WORKBENCH_WORKSPACE = root (the `workspace` fixture)."""
    varied = make_eval("reverse-words", VariedClient(), 12, 4, "20260102-030405-aaaa")
    base = make_eval(
        "reverse-words",
        EchoClient(mode="echo"),
        12,
        4,
        "20260101-030405-bbbb",
        model="echo",
        created_at="2026-01-01T03:04:05+00:00",
    )
    tools = make_eval(
        "lookup-facts", EchoClient(), 3, 2, "20260102-030405-cccc", created_at="2026-01-02T02:04:05+00:00"
    )
    train = make_train_run(root, rollouts_from=varied)
    gepa = make_gepa_run(root)
    return {"varied": varied, "base": base, "tools": tools, "train": train, "gepa": gepa}


async def wait_for(pilot: Any, predicate: Any, timeout: float = 120.0, step: float = 0.05) -> float:
    """Pause the app until `predicate()` is true; returns the seconds it took. The timeout only
    guards against a hang: on a busy machine a screen may take many seconds, and how fast it is
    belongs to benchmarks/, not to a test."""
    import time

    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        await pilot.pause(step)
    # The state a predicate reads may change before the screen shows it (a worker sets it, then
    # posts the update): one more pause processes what is queued and lays the screen out.
    await pilot.pause()
    return time.monotonic() - started


def text_of(widget: Any) -> str:
    """What a widget shows on screen right now, as plain text (its visible lines)."""
    return "\n".join(widget.render_line(y).text for y in range(widget.size.height))
