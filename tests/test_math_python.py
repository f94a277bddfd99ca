"""math-python and the sandbox: every limit proven through a real rollout (infinite loop, sleep,
memory bomb, fork bomb, API key in the environment, socket to 127.0.0.1) — each fails safely, the
rollout records a tool error and goes on; generated data; hand-written completions; the CLI."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import pytest

from tests import cli
from tests.servers import EchoBackend, make_app, serve_in_thread
from tests.test_envs import ScriptedClient, tool_call
from workbench.envs import load_environment
from workbench.envs.environment import RolloutOutput
from workbench.envs.gsm8k_data import shipped_gsm8k_path
from workbench.envs.sandbox import SandboxLimits, run_python
from workbench.errors import UserError
from workbench.types import SamplingParams

pytestmark = pytest.mark.timeout(60)

GSM8K = shipped_gsm8k_path()  # GSM8K's train split as shipped with the gsm8k environment
# Small limits keep the fork bomb and the loops short; the machine must survive them.
LIMITS = {"timeout_s": 3.0, "cpu_time_s": 1, "memory_mb": 256, "max_processes": 8}


@pytest.fixture(autouse=True)
def own_sandboxes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's sandboxes make their working dirs (named in the child's command line) under its
    tmp_path, so `sandbox_processes` sees them alone: other xdist workers run sandboxes too."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def sandbox_processes() -> list[int]:
    """Pids of this test's sandbox processes still alive (their command line names the child
    script and a working dir under the test's temp folder, see `own_sandboxes`)."""
    pids = []
    mine = tempfile.gettempdir().encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if b"sandbox_child.py" in cmdline and mine in cmdline:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


async def run_tool_rollout(code: str, **env_args):
    """One rollout: the model calls `python(code)`, then answers. Returns (tool message, output)."""
    env = load_environment("math-python", **{**LIMITS, **env_args})
    example = env.get_examples(1)[0]
    client = ScriptedClient(
        [
            tool_call("python", json.dumps({"code": code})),
            {"role": "assistant", "content": f"\\boxed{{{example.answer}}}"},
        ]
    )
    out = await env.rollout(client, example, SamplingParams())
    assert out.error is None and out.stop_condition == "completed" and out.num_turns == 2  # the run went on
    assert out.state["tool_calls"] == 1
    score = (await env.score_group(example, [out]))[0]
    assert score.reward == 1.0 and score.metrics["num_tool_calls"] == 1.0
    return out.completion[1]["content"], out


async def expect_tool_error(code: str, *needles: str, **env_args) -> str:
    message, out = await run_tool_rollout(code, **env_args)
    assert message.startswith("Error: SandboxError:"), message
    assert any(n in message for n in needles), message
    assert out.state["tool_errors"] == 1
    assert not sandbox_processes()
    return message


async def isolation() -> dict[str, str]:
    return (await run_python("pass")).isolation


# ----- the tool works ------------------------------------------------------------------------
def test_tool_schema():
    env = load_environment("math-python")
    (schema,) = env.oai_tools
    assert schema["function"]["name"] == "python"
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert schema["function"]["parameters"]["properties"]["code"]["type"] == "string"


async def test_successful_call_returns_output():
    message, out = await run_tool_rollout("import math\nprint(math.factorial(20))")
    assert message == "2432902008176640000" and out.state["tool_errors"] == 0


async def test_code_error_is_a_tool_error_with_traceback():
    message = await expect_tool_error("x = 1\ny = x / 0", "ZeroDivisionError")
    assert 'File "main.py", line 2' in message and "exited with status 1" in message


async def test_fresh_working_dir_deleted_afterwards():
    first = await run_python("import os; open('note.txt', 'w').write('x'); print(os.getcwd())")
    second = await run_python("import os; print(os.listdir('.'))")
    assert first.ok and second.ok and second.stdout.strip() == "[]"
    assert not Path(first.stdout.strip()).exists()


async def test_output_is_truncated():
    message, _ = await run_tool_rollout("print('x' * 100_000)", max_output_chars=500)
    assert len(message) < 800 and "[output truncated]" in message


# ----- each limit fails safely ----------------------------------------------------------------
async def test_infinite_loop_hits_cpu_limit():
    await expect_tool_error("while True:\n    pass", "CPU time limit of 1 s exceeded", "timed out")


async def test_sleep_hits_wall_clock_timeout():
    message = await expect_tool_error(
        "import time\nprint('started', flush=True)\ntime.sleep(60)",
        "wall-clock limit of 2 s exceeded",
        timeout_s=2.0,
    )
    assert "started" in message  # output before the kill is kept


@pytest.mark.parametrize(
    "code", ["x = bytearray(10**10)", "chunks = []\nwhile True:\n    chunks.append(' ' * 10**7)"]
)
async def test_memory_bomb_hits_memory_limit(code):
    await expect_tool_error(code, "MemoryError")


async def test_process_limit_stops_forks():
    if "not enforced" in (await isolation())["process_limit"]:
        pytest.skip(
            "RLIMIT_NPROC cannot be enforced here (root without namespaces or a readable interpreter)"
        )
    code = (
        "import os, time\nn = 0\nfor _ in range(100):\n    try:\n        pid = os.fork()\n"
        "    except OSError as exc:\n        print('fork failed:', exc.strerror)\n        break\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint('children', n)"
    )
    message, _ = await run_tool_rollout(code)
    assert "fork failed" in message
    assert int(message.split("children")[1]) < LIMITS["max_processes"]
    assert not sandbox_processes()  # the sleeping children were killed with the sandbox


async def test_fork_bomb_is_contained():
    if "not enforced" in (await isolation())["process_limit"]:
        pytest.skip(
            "RLIMIT_NPROC cannot be enforced here (root without namespaces or a readable interpreter)"
        )
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    await expect_tool_error(bomb, "timed out", "CPU time limit")


async def test_api_key_in_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-123")
    code = (
        "import os\nprint('env:', os.environ.get('OPENAI_API_KEY'))\nfound = []\n"
        "for pid in os.listdir('/proc'):\n    try:\n"
        "        if b'sk-test-secret-123' in open(f'/proc/{pid}/environ', 'rb').read():\n            found.append(pid)\n"
        "    except OSError:\n        pass\nprint('proc:', found)\nraise SystemExit(3)"
    )
    message = await expect_tool_error(code, "exited with status 3")
    assert "env: None" in message and "sk-test" not in message.split("proc:")[0]
    iso = await isolation()
    if "fresh /proc" in iso["filesystem"] or "dropped from root" in iso["user"]:
        assert "proc: []" in message  # no other process's environment is readable either


async def test_socket_to_localhost_fails():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        await expect_tool_error(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')",
            "Network is unreachable",
            "network access is disabled",
            "Connection refused",
        )
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    finally:
        listener.close()


async def test_concurrent_sandboxes():
    import asyncio

    results = await asyncio.gather(
        *[run_python(f"print({i} ** 3)", SandboxLimits(**LIMITS)) for i in range(12)]
    )
    assert [r.stdout.strip() for r in results] == [str(i**3) for i in range(12)]


# ----- data, rewards, CLI ---------------------------------------------------------------------
def test_generated_data_seeded_disjoint_and_correct():
    env = load_environment("math-python", num_train_examples=300, num_eval_examples=50)
    train, evals = env.get_examples(split="train"), env.get_examples(split="eval")
    assert len(train) == 300 and len(evals) == 50
    assert not {e.prompt[-1]["content"] for e in train} & {e.prompt[-1]["content"] for e in evals}
    again = load_environment("math-python", num_train_examples=300, num_eval_examples=50).get_examples()
    assert [e.prompt for e in again] == [e.prompt for e in evals]
    kinds = {e.info["kind"]: e for e in train}
    assert len(kinds) == 7
    for example in kinds.values():  # each kind's reference code, run in the sandbox, gives the answer
        assert example.answer.lstrip("-").isdigit()
        assert exec_output(example.info["code"]) == example.answer


def exec_output(code: str) -> str:
    from workbench.envs.sandbox import run_python_sync

    result = run_python_sync(code)
    assert result.ok, result.describe()
    return result.stdout.strip()


async def test_hand_written_completions_score():
    env = load_environment("math-python")
    example = env.get_examples(1)[0]

    def reply(*messages):
        return RolloutOutput(list(messages), {})

    right = {"role": "assistant", "content": f"So the result is \\boxed{{{int(example.answer):,}}}."}
    cases = [
        RolloutOutput(env.reference_completion(example), {"tool_calls": 1}),  # 1: tool call then boxed answer
        reply(right),  # 1: no tool needed
        reply({"role": "assistant", "content": f"\\boxed{{{int(example.answer) + 1}}}"}),  # 0: wrong
        reply({"role": "assistant", "content": "Let me think \\boxed{"}),  # 0: malformed
        reply(tool_call("python", "{not json")),  # 0: ended on a bad tool call
        reply(),  # 0: nothing
    ]
    scores = await env.score_group(example, cases)
    assert [s.reward for s in scores] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert scores[0].metrics["num_tool_calls"] == 1.0 and scores[1].metrics["format_reward"] == 1.0
    assert all(s.error is None for s in scores)


def test_gsm8k_data_path_and_owner_prefix():
    env = load_environment("primeintellect/math-python", data_path=str(GSM8K), num_eval_examples=10)
    assert env.env_id == "math-python" and len(env.get_examples()) == 10
    assert env.get_examples()[0].answer.lstrip("-").isdigit()


def test_dataset_gsm8k_reads_the_shipped_copy_and_a_wrong_name_is_one_line():
    shipped = load_environment("math-python", dataset="gsm8k", num_eval_examples=10)
    given = load_environment("math-python", data_path=str(GSM8K), num_eval_examples=10)
    assert [e.prompt for e in shipped.get_examples()] == [e.prompt for e in given.get_examples()]
    assert (
        len(shipped.get_examples(split="train")) == 7473 - 10 and "solution" in shipped.get_examples()[0].info
    )
    with pytest.raises(UserError, match="argument 'dataset' = 'gsm9k'") as info:
        load_environment("math-python", dataset="gsm9k")
    assert "\n" not in str(info.value)


@pytest.mark.timeout(180)
def test_eval_run_end_to_end(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}
    with serve_in_thread(make_app(EchoBackend())) as url:
        # The echo model calls `python` with the question as code (a SyntaxError): a tool error per rollout.
        proc = cli.run(
            [
                sys.executable,
                "-m",
                "workbench",
                "eval",
                "run",
                "math-python",
                "-m",
                "echo",
                "-b",
                f"{url}/v1",
                "-n",
                "4",
                "-r",
                "2",
                "-C",
                "tool_errors,tool_calls",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )
    assert proc.returncode == 0, proc.stderr
    run_dir = next(
        (tmp_path / "environments" / "math_python" / "outputs" / "evals" / "math-python--echo").iterdir()
    )
    records = [
        json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()
    ]
    assert len(records) == 8 and all(r["error"] is None for r in records)
    assert all(r["state"] == {"tool_errors": 1, "tool_calls": 1} for r in records)
    assert all(
        r["completion"][1]["role"] == "tool" and "SyntaxError" in r["completion"][1]["content"]
        for r in records
    )
