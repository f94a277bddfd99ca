"""`workbench gepa run` end to end with the real `gepa` library, over HTTP on 127.0.0.1.

The policy is a deterministic program behind the OpenAI-compatible API whose accuracy depends
on its system prompt: the more times the prompt says KEYWORD (up to LEVELS), the more kinds of
text it reverses correctly; the rest it echoes unreversed (partial credit). The reflection model
is another program that, when the feedback it is shown has failures, proposes the current
instruction plus one more KEYWORD sentence inside a ``` block. GEPA should climb to the top.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests import cli
from tests.conftest import FIXTURES
from tests.servers import Gate, ScriptedBackend, make_app, serve_in_thread
from tests.test_cli_errors import assert_one_line_error
from workbench.types import Completion

KEYWORD = "BACKWARDS"
LEVELS = 3


# ----- the two model servers -----------------------------------------------------------------
class Policy:
    """Reverses a text correctly when the prompt says KEYWORD more than len(text) % LEVELS times; else echoes it."""

    def __init__(self) -> None:
        self.requests = 0
        self.lock = threading.Lock()

    def __call__(self, messages: list[dict[str, Any]], sampling: Any, tools: Any) -> list[Completion]:
        with self.lock:
            self.requests += 1
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        text = messages[-1]["content"]
        answer = text[::-1] if system.count(KEYWORD) > len(text) % LEVELS else text
        return [
            Completion(
                message={"role": "assistant", "content": f"<reversed_text>{answer}</reversed_text>"},
                finish_reason="stop",
                prompt_tokens=len(text),
                completion_tokens=len(answer) + 31,
            )
        ]


class Reflection:
    """Reads gepa's reflection prompt; on failures, proposes the current instruction plus a KEYWORD sentence."""

    def __init__(self, garbage: bool = False) -> None:
        self.garbage = garbage
        self.prompts: list[str] = []

    def __call__(self, messages: list[dict[str, Any]], sampling: Any, tools: Any) -> list[Completion]:
        prompt = messages[-1]["content"]
        self.prompts.append(prompt)
        if self.garbage:
            reply = "lol idk, prompts are hard"
        else:
            current = prompt.split("```")[
                1
            ].strip()  # gepa's template shows the instruction in the first block
            failing = "This answer scored 1.000" not in prompt or "This answer scored 0." in prompt
            addition = f"\nAlways write the text {KEYWORD}: last character first." if failing else ""
            reply = f"Here is a better instruction:\n```\n{current}{addition}\n```"
        return [Completion(message={"role": "assistant", "content": reply}, finish_reason="stop")]


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}, **(env or {})}


def workbench(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def start(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """A real process, for a test that signals it."""
    return subprocess.Popen(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str] | subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """A command's (stdout, stderr), once it has finished."""
    if isinstance(proc, subprocess.Popen):
        return proc.communicate(timeout=300)
    return proc.stdout, proc.stderr


def gepa_args(policy_url: str, reflection_url: str, *extra: str) -> list[str]:
    return [
        "gepa",
        "run",
        "reverse-text",
        "-m",
        "policy",
        "-b",
        f"{policy_url}/v1",
        "-M",
        "reflect",
        "--reflection-base-url",
        f"{reflection_url}/v1",
        "-n",
        "9",
        "-N",
        "10",
        "--minibatch-size",
        "3",
        *extra,
    ]


def only_run(tmp_path: Path) -> Path:
    runs = list(
        (tmp_path / "environments" / "reverse_text" / "outputs" / "gepa" / "reverse-text--policy").iterdir()
    )
    assert len(runs) == 1, runs
    return runs[0]


def metadata(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "metadata.json").read_text())


# ----- end to end ----------------------------------------------------------------------------
def test_gepa_finds_a_better_prompt_within_budget(tmp_path: Path):
    policy, reflection = Policy(), Reflection()
    with (
        serve_in_thread(make_app(ScriptedBackend(policy, model="policy"))) as p_url,
        serve_in_thread(make_app(ScriptedBackend(reflection, model="reflect"))) as r_url,
    ):
        proc = workbench(*gepa_args(p_url, r_url, "-B", "150", "-C", "turn", "--seed", "3"), cwd=tmp_path)
        out, err = finish(proc)
    assert proc.returncode == 0, err
    run_dir = only_run(tmp_path)
    meta = metadata(run_dir)

    # the optimization worked: it climbed to the prompt that says KEYWORD LEVELS times
    assert meta["kind"] == "gepa" and meta["status"] == "finished"
    assert meta["seed_score"] < 0.5 and meta["best_score"] == pytest.approx(1.0)
    best = (run_dir / "best_prompt.txt").read_text()
    assert best.count(KEYWORD) == LEVELS and best.startswith("Reverse the text")
    assert meta["candidates"][meta["best_candidate"]]["prompt"] == best.strip()
    assert meta["candidates"][0]["prompt"] == meta["seed_prompt"] and KEYWORD not in meta["seed_prompt"]
    scores = [c["val_score"] for c in meta["candidates"]]
    assert len(scores) == LEVELS + 1 and scores == sorted(scores)  # each accepted prompt beat its parent

    # the budget: counted as gepa counts (one rollout = one call = one request here), never passed;
    # a perfect validation score ends the run early
    assert policy.requests == meta["metric_calls_used"] == meta["rollouts"] <= 150
    assert meta["stopped_early"] and "stopped early" in out

    # the Pareto frontier: one line per validation example, best score and the prompts reaching it
    frontier = [json.loads(line) for line in (run_dir / "pareto_frontier.jsonl").read_text().splitlines()]
    assert [row["example_id"] for row in frontier] == list(range(10))
    for row in frontier:
        assert row["best_score"] == pytest.approx(1.0)
        assert best.strip() in row["prompts"] and len(row["prompts"]) == len(row["candidates"])
        assert all(
            meta["candidates"][i]["prompt"] == text for i, text in zip(row["candidates"], row["prompts"])
        )

    # the reflection model saw input, output, expected answer, per-function scores and state columns
    seen = reflection.prompts[0]
    for needle in (
        "## Inputs",
        "## Generated Outputs",
        "## Expected Answer",
        "### lcs_reward",
        "### format_reward",
        "## State\n### turn",
        "This answer scored",
    ):
        assert needle in seen, needle
    assert meta["reflections"]["proposed"] == len(reflection.prompts) >= LEVELS

    # library state for resuming, our log, and the summary on the terminal
    assert (run_dir / "gepa_state" / "gepa_state.bin").is_file()
    assert "finished" in (run_dir / "run.log").read_text()
    assert "→ best 1.0000" in out and f"{meta['metric_calls_used']} of 150" in out and KEYWORD in out
    assert "candidate 1 accepted" in err


def test_budget_is_never_passed(tmp_path: Path):
    """A budget that runs out mid-climb: gepa checks only between iterations, the adapter refuses
    the evaluation that would pass it, and the run still finishes cleanly."""
    policy, reflection = Policy(), Reflection()
    with (
        serve_in_thread(make_app(ScriptedBackend(policy, model="policy"))) as p_url,
        serve_in_thread(make_app(ScriptedBackend(reflection, model="reflect"))) as r_url,
    ):
        # --seed picks the minibatches; with seed 1 the first proposal is accepted before the budget
        # runs out (which minibatch comes first depends on the env's data, not on the budget logic)
        proc = workbench(*gepa_args(p_url, r_url, "-B", "30", "--seed", "1"), cwd=tmp_path)
        _, err = finish(proc)
    assert proc.returncode == 0, err
    meta = metadata(only_run(tmp_path))
    assert meta["status"] == "finished" and not meta.get("stopped_early")
    assert policy.requests == meta["metric_calls_used"] <= 30
    # 10 (seed) + 6 (minibatch before/after) + 10 (accepted) = 26; the next proposal's validation would pass 30
    assert meta["best_score"] > meta["seed_score"] and len(meta["candidates"]) == 2
    assert "budget spent" in (only_run(tmp_path) / "run.log").read_text()


def test_garbage_reflection_is_recorded_and_the_run_finishes(tmp_path: Path):
    policy, reflection = Policy(), Reflection(garbage=True)
    out_dir = tmp_path / "my-gepa-run"
    with (
        serve_in_thread(make_app(ScriptedBackend(policy, model="policy"))) as p_url,
        serve_in_thread(make_app(ScriptedBackend(reflection, model="reflect"))) as r_url,
    ):
        proc = workbench(*gepa_args(p_url, r_url, "-B", "25", "-o", str(out_dir)), cwd=tmp_path)
        _, err = finish(proc)
        assert proc.returncode == 0, err
        again = workbench(*gepa_args(p_url, r_url, "-B", "25", "-o", str(out_dir)), cwd=tmp_path)
        _, again_err = finish(again)
    meta = metadata(out_dir)  # -o is the run folder itself
    assert meta["status"] == "finished" and meta["metric_calls_used"] == 25  # 10 + 5 minibatches of 3
    assert meta["reflections"]["unusable"] == len(reflection.prompts) == 5
    assert meta["reflections"]["proposed"] == 0 and len(meta["candidates"]) == 1
    assert meta["best_score"] == meta["seed_score"]
    assert any(
        e["kind"] == "reflection_unusable" and "no ``` block" in e["detail"] and "lol idk" in e["detail"]
        for e in meta["events"]
    )
    assert "no usable prompt" in err
    assert_one_line_error(
        subprocess.CompletedProcess(again.args, again.returncode, "", again_err),
        "already holds a run",
        "--resume",
    )


def test_failing_reflection_endpoint_is_recorded_not_fatal(tmp_path: Path):
    from tests.servers import raising
    from workbench.errors import InferenceError

    policy = Policy()
    broken = raising(InferenceError("reflection backend exploded", transient=False))
    broken.model = "reflect"
    with (
        serve_in_thread(make_app(ScriptedBackend(policy, model="policy"))) as p_url,
        serve_in_thread(make_app(broken)) as r_url,
    ):
        proc = workbench(*gepa_args(p_url, r_url, "-B", "16"), cwd=tmp_path)
        _, err = finish(proc)
    assert proc.returncode == 0, err
    meta = metadata(only_run(tmp_path))
    assert meta["status"] == "finished" and meta["reflections"]["error"] >= 1
    assert meta["metric_calls_used"] <= 16


def test_a_policy_server_that_rejects_requests_is_not_scored_and_says_why(tmp_path: Path):
    """A failed model call is no result (issue 33): the seed's batch with rejected requests is not
    scored, and the run gives up with the server's own message and the resume line."""
    from tests.servers import FaultInjector

    policy, reflection = Policy(), Reflection()
    faults = FaultInjector(fail_rate=0.25, status=400, seed=1)  # permanent errors: not retried
    with (
        serve_in_thread(
            make_app(ScriptedBackend(policy, model="policy"), middlewares=(faults.middleware,))
        ) as p_url,
        serve_in_thread(make_app(ScriptedBackend(reflection, model="reflect"))) as r_url,
    ):
        proc = workbench(*gepa_args(p_url, r_url, "-B", "60"), cwd=tmp_path)
        _, err = finish(proc)
    assert proc.returncode == 1, err
    [line] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert "failed on the model call (HTTP 400" in line and "injected fault 400" in line, line
    assert "this evaluation is not scored" in line and "workbench gepa run -R " in line, line
    meta = metadata(only_run(tmp_path))
    assert meta["status"] == "failed" and faults.failed > 0


PICKY_ENV = """
from workbench.envs import Rubric, SingleTurnEnv, XMLParser

WORDS = ["apple", "river", "stone", "cloud", "green", "quiet"]


def load_environment(system_prompt: str = "Reverse the text. Answer in <reversed_text> tags."):
    if "BACKWARDS" in system_prompt:
        raise ValueError("this env refuses prompts that shout")
    parser = XMLParser(["reversed_text"], answer_field="reversed_text")

    def exact(completion, answer):
        return float(parser.parse_answer(completion) == answer)

    rows = [{"question": w, "answer": w[::-1]} for w in WORDS]
    return SingleTurnEnv(dataset=rows, eval_dataset=rows, system_prompt=system_prompt, parser=parser,
                         rubric=Rubric([exact], parser=parser))
"""


def test_env_error_for_a_candidate_is_recorded_not_fatal(tmp_path: Path):
    env_dir = tmp_path / "environments" / "picky"
    env_dir.mkdir(parents=True)
    (env_dir / "picky.py").write_text(PICKY_ENV)
    policy, reflection = Policy(), Reflection()
    with (
        serve_in_thread(make_app(ScriptedBackend(policy, model="policy"))) as p_url,
        serve_in_thread(make_app(ScriptedBackend(reflection, model="reflect"))) as r_url,
    ):
        proc = workbench(
            "gepa",
            "run",
            "picky",
            "-m",
            "policy",
            "-b",
            f"{p_url}/v1",
            "-M",
            "reflect",
            "--reflection-base-url",
            f"{r_url}/v1",
            "-n",
            "3",
            "-N",
            "3",
            "-B",
            "15",
            cwd=tmp_path,
        )
        _, err = finish(proc)
    assert proc.returncode == 0, err
    run_dir = next((tmp_path / "environments" / "picky" / "outputs" / "gepa").glob("*/*"))
    meta = metadata(run_dir)
    assert meta["status"] == "finished" and meta["metric_calls_used"] == 15  # 3 + two iterations of 3 + 3
    assert meta["rollout_errors"] == 6 and len(meta["candidates"]) == 1  # each proposal: 3 failed rollouts
    assert policy.requests == 3 + 3 + 3  # the seed scored, then each parent minibatch; children never ran
    assert (
        "env error UserError: environment 'picky' failed to load: ValueError: this env refuses prompts that shout"
        in (run_dir / "run.log").read_text()
    )


def below_level(level: int):
    """`Gate` admission: policy requests whose system prompt says KEYWORD fewer than `level` times."""

    def admit(body: dict[str, Any]) -> bool:
        system = next(
            (m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "system"), ""
        )
        return system.count(KEYWORD) < level

    return admit


def test_interrupted_run_resumes_without_redoing_work(tmp_path: Path):
    policy, reflection = Policy(), Reflection()
    # The policy server answers prompts with fewer than 2 KEYWORDs and holds the rest: the run climbs
    # to candidate 1 (one KEYWORD), then is stuck evaluating its first 2-KEYWORD child, mid-climb,
    # until the test has pressed Ctrl-C. Held requests never reach the policy (dropped on release).
    gate = Gate(below_level(2))
    with (
        serve_in_thread(
            make_app(ScriptedBackend(policy, model="policy"), middlewares=(gate.middleware,))
        ) as p_url,
        serve_in_thread(make_app(ScriptedBackend(reflection, model="reflect"))) as r_url,
        gate,
    ):
        proc = start(*gepa_args(p_url, r_url, "-B", "300", "-c", "2"), cwd=tmp_path)
        gate.wait_held(proc=proc)
        runs = list(tmp_path.glob("environments/reverse_text/outputs/gepa/*/*/metadata.json"))
        assert len(runs) == 1 and proc.poll() is None, "the run should still be going"
        run_dir = runs[0].parent
        assert len(metadata(run_dir)["candidates"]) >= 2  # candidate 1 was written when its iteration ended
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = finish(proc)
        assert proc.returncode == 130, err
        stopped = metadata(run_dir)
        assert stopped["status"] == "stopped" and f"--resume {run_dir}" in err
        assert "· stopped" in out and "→ best" in out  # the summary of what was found so far
        assert (run_dir / "gepa_state" / "gepa_state.bin").is_file()
        assert len(stopped["candidates"]) < LEVELS + 1  # interrupted before the top

        gate.open(drop_held=True)  # the stopped run's held requests are dropped: the policy never counts them
        before = policy.requests
        resumed = workbench("gepa", "run", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    meta = metadata(run_dir)
    assert meta["status"] == "finished" and meta["created_at"] == stopped["created_at"]
    assert meta["metric_calls_used"] <= 300 and meta["best_score"] == pytest.approx(1.0)
    assert meta["candidates"][:2] == stopped["candidates"][:2]  # what was found is kept
    log = (run_dir / "run.log").read_text()
    resumed_at = int(log.split("resume ", 1)[1].split("budget=", 1)[1].split("/", 1)[0])
    assert resumed_at >= 10 + 6 + 10  # seed evaluation + the first accepted proposal
    # the resumed session paid only for new calls: the seed prompt was not scored again
    assert policy.requests - before == meta["metric_calls_used"] - resumed_at


# ----- user mistakes and the plan --------------------------------------------------------------
NO_PROMPT_ENV = """
from workbench.envs import SingleTurnEnv


def load_environment(num_examples: int = 4):
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(num_examples)]
    return SingleTurnEnv(dataset=rows, system_prompt="fixed")
"""


def test_env_without_system_prompt_argument_is_one_line_error(tmp_path: Path):
    env_dir = tmp_path / "environments" / "no_prompt"
    env_dir.mkdir(parents=True)
    (env_dir / "no_prompt.py").write_text(NO_PROMPT_ENV)
    proc = workbench("gepa", "run", "no-prompt", "-m", "x", "-b", "http://127.0.0.1:9/v1", cwd=tmp_path)
    _, err = finish(proc)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, "", err)
    assert_one_line_error(result, "no-prompt", "system_prompt")


def test_budget_below_validation_set_is_one_line_error(tmp_path: Path):
    proc = workbench(
        "gepa",
        "run",
        "reverse-text",
        "-m",
        "x",
        "-b",
        "http://127.0.0.1:9/v1",
        "-N",
        "20",
        "-B",
        "5",
        cwd=tmp_path,
    )
    _, err = finish(proc)
    assert_one_line_error(
        subprocess.CompletedProcess(proc.args, proc.returncode, "", err), "--max-calls", "20"
    )


def test_seed_config_dry_run_shows_plan_and_reports_unknown_env(tmp_path: Path):
    proc = workbench("gepa", "run", str(FIXTURES / "seed-configs" / "gepa.toml"), "--dry-run", cwd=tmp_path)
    out, err = finish(proc)
    assert_one_line_error(
        subprocess.CompletedProcess(proc.args, proc.returncode, "", err),
        "gepa.toml",
        "a real run cannot start",
        "unknown environment 'my-env'",
    )
    for needle in (
        "my-env",
        "google/gemini-3-flash-preview",
        "google/gemini-3-exp-ultra-preview",
        "1000",
        "200 examples",
        "100 examples",
        "minibatch of 5",
        "parsed_answer, tool_calls",
        "unknown environment 'my-env'",
        "dry run: config is valid",
    ):
        assert needle in out, needle
    assert not (tmp_path / "environments").exists()  # nothing written


def test_toml_config_typo_names_file_line_and_key(tmp_path: Path):
    config = tmp_path / "gepa.toml"
    config.write_text('env_id = "reverse-text"\nmodel = "x"\nmax_cals = 10\n')
    proc = workbench("gepa", "run", str(config), "--dry-run", cwd=tmp_path)
    _, err = finish(proc)
    assert_one_line_error(
        subprocess.CompletedProcess(proc.args, proc.returncode, "", err),
        "gepa.toml:3",
        "max_cals",
        "max_calls",
    )


# ----- small pieces ----------------------------------------------------------------------------
def test_extract_prompt_rejects_unusable_replies():
    from workbench.gepa.reflection import extract_prompt

    assert extract_prompt("```\nNew prompt\n```", "Old") == ("New prompt", "")
    assert extract_prompt("Sure!\n```text\nNew prompt\n```\nthanks", "Old")[0] == "New prompt"
    assert extract_prompt("", "Old")[0] is None
    assert extract_prompt("just words", "Old")[1].startswith("no ``` block")
    assert extract_prompt("```\n\n```", "Old")[1] == "the ``` block is empty"
    assert extract_prompt("```\nOld\n```", "Old")[1] == "the proposed prompt is the current one"


def test_budget_refuses_what_would_pass_it():
    from workbench.gepa.adapter import Budget, BudgetSpent

    budget = Budget(10, used=4)
    budget.spend(6)
    assert budget.remaining == 0 and not budget.exhausted
    with pytest.raises(BudgetSpent):
        budget.spend(1)
    assert budget.exhausted and budget.used == 10


def test_reflective_record_carries_errors_tools_state_and_metrics():
    from workbench.gepa.adapter import reflective_record
    from workbench.types import Rollout, RolloutError

    rollout = Rollout(
        example_id=3,
        rollout_index=0,
        prompt=[{"role": "system", "content": "SYSTEM"}, {"role": "user", "content": "What is 2+2?"}],
        completion=[
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c0",
                        "type": "function",
                        "function": {"name": "calc", "arguments": '{"x": "2+2"}'},
                    }
                ],
            },
            {"role": "tool", "content": "4"},
            {"role": "assistant", "content": "<answer>5</answer>"},
        ],
        answer="4",
        reward=0.0,
        rewards={"correct": 0.0},
        metrics={"num_tool_calls": 1.0},
        error=RolloutError("TimeoutError", "tool timed out", "env"),
        is_truncated=True,
        state_columns={"parsed_answer": "5"},
    )
    record = reflective_record(rollout, 1.0)
    assert record["Inputs"] == "What is 2+2?"  # the system prompt is the instruction under edit, shown apart
    assert "[tool call] calc" in record["Generated Outputs"] and "[tool] 4" in record["Generated Outputs"]
    assert record["Expected Answer"] == "4"
    assert record["Scores"] == {"reward": "0.000", "correct": "0.000", "num_tool_calls": "1.000"}
    assert record["Error"] == "env error TimeoutError: tool timed out"
    assert record["State"] == {"parsed_answer": "'5'"}
    for needle in (
        "scored 0.000",
        "correct = 0.000",
        "num_tool_calls = 1.000",
        "expected answer is: 4",
        "TimeoutError",
        "cut off",
    ):
        assert needle in record["Feedback"], needle
