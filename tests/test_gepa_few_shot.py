"""DSPy runs (MIPROv2, BootstrapFewShot) in a GEPA run folder: their best candidate is a system
prompt plus few-shot turns. `gepa apply` writes both defaults, `gepa verify` evaluates the best
side with its turns and the seed side without, and the TUI shows the turns under the prompt.
Run folders are written by hand, in the layout the DSPy runs write, with the real run models;
evaluations go over HTTP to the scripted policy of tests/test_gepa.py."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import ScriptedBackend, make_app, serve_in_thread
from tests.test_gepa import Policy, finish, workbench
from tests.tui_data import text_of, wait_for
from workbench.gepa.apply import apply_defaults, value_literal
from workbench.store.files import write_json_atomic
from workbench.store.runs import GepaRun, create_run_dir, write_run_metadata
from workbench.tui.data.gepa import load_gepa_run

REPO = Path(__file__).resolve().parents[1]
SEED = "Reverse the text character by character. Put your answer in <reversed_text> tags."
BEST = "Reverse the text, last character first.\nAnswer inside <reversed_text> tags."
TURNS = [
    {"role": "user", "content": "red fox"},
    {"role": "assistant", "content": "<reversed_text>\nxof der\n</reversed_text>"},
    {"role": "user", "content": 'it\'s "quoted" — ünïcode'},
    {"role": "assistant", "content": '<reversed_text>\nedocïnü — "detouq" s\'ti\n</reversed_text>'},
]


def make_dspy_run(
    root: Path,
    env_id: str = "reverse-text",
    *,
    policy_url: str | None = None,
    demos_as: str = "turns",
    run_id: str = "20260102-030405-d5d5",
) -> Path:
    """A finished MIPROv2 run folder as `gepa run --optimizer miprov2` writes it: the seed
    (index 0, no turns) and a best candidate with TURNS; validated on eval rows 0..9."""
    module = env_id.replace("-", "_")
    run_dir = create_run_dir(
        root / "environments" / module / "outputs" / "gepa" / f"{env_id}--policy" / run_id
    )
    candidates = [
        {
            "index": 0,
            "val_score": 0.3,
            "val_examples": 10,
            "parents": [],
            "discovered_at_calls": 0,
            "prompt": SEED,
            "few_shot": [],
        },
        {
            "index": 1,
            "val_score": 0.9,
            "val_examples": 10,
            "parents": [0],
            "discovered_at_calls": 40,
            "prompt": BEST,
            "few_shot": TURNS,
        },
    ]
    config = {
        "env_id": env_id,
        "model": "policy",
        "num_train": 9,
        "num_val": 10,
        "seed": 3,
        "api_base_url": policy_url,
    }
    write_run_metadata(
        run_dir,
        GepaRun(
            status="finished",
            run_id=run_id,
            env_id=env_id,
            model="policy",
            config=config,
            num_train=9,
            num_val=10,
            seed_prompt=SEED,
            seed_score=0.3,
            best_score=0.9,
            best_candidate=1,
            num_candidates=2,
            candidates=candidates,
            metric_calls_used=80,
            max_calls=100,
            optimizer="miprov2",
            optimizer_version="3.0.0",
            demos_as=demos_as,
            best_few_shot=TURNS if demos_as == "turns" else [],
            pid=None,
        ),
    )
    (run_dir / "best_prompt.txt").write_text(BEST + "\n", encoding="utf-8")
    if demos_as == "turns":
        write_json_atomic(run_dir / "best_few_shot.json", TURNS)
    return run_dir


def copy_reverse_text(root: Path) -> Path:
    env_dir = root / "environments" / "reverse_text"
    env_dir.mkdir(parents=True, exist_ok=True)
    return Path(
        shutil.copy(REPO / "environments" / "reverse_text" / "reverse_text.py", env_dir / "reverse_text.py")
    )


def newest_results(root: Path, module: str = "reverse_text", count: int = 1) -> list[list[dict[str, Any]]]:
    """The records of the newest `count` eval runs of the env, oldest first."""
    runs = sorted(
        (root / "environments" / module / "outputs" / "evals").glob("*/*/results.jsonl"),
        key=lambda p: p.stat().st_mtime,
    )[-count:]
    return [[json.loads(line) for line in path.read_text().splitlines()] for path in runs]


def python(code: str, cwd: Path) -> subprocess.Popen[str]:
    """`python -c code` in `cwd`, as `workbench` (tests/test_gepa.py) runs commands there."""
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def policy_url() -> Iterator[str]:
    with serve_in_thread(make_app(ScriptedBackend(Policy(), model="policy"))) as url:
        yield f"{url}/v1"


# ----- apply -----------------------------------------------------------------------------------
def test_apply_writes_prompt_and_few_shot_defaults(tmp_path: Path, policy_url: str):
    env_file = copy_reverse_text(tmp_path)
    run = make_dspy_run(tmp_path)
    proc = workbench("gepa", "apply", str(run), cwd=tmp_path)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    text = " ".join(out.split())
    assert "SYSTEM_PROMPT" in text and "the default of few_shot" in text and "(4 messages)" in text

    # the file says exactly the new values, and load_environment (in a fresh process) takes them up
    tree = ast.parse(env_file.read_text())
    constant = next(
        n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "SYSTEM_PROMPT"
    )
    assert ast.literal_eval(constant) == BEST
    probe = (
        "import json; from workbench.envs.loader import load_environment; env = load_environment('reverse-text'); "
        "print(json.dumps({'system': env.system_prompt, 'few_shot': env.few_shot}))"
    )
    proc = python(probe, tmp_path)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[-1]) == {"system": BEST, "few_shot": TURNS}

    # a plain eval (no -a) sends the system prompt, the turns, then the question
    proc = workbench(
        "eval", "run", "reverse-text", "-m", "policy", "-b", policy_url, "-n", "3", "-r", "1", cwd=tmp_path
    )
    _, err = finish(proc)
    assert proc.returncode == 0, err
    [records] = newest_results(tmp_path)
    assert len(records) == 3
    for record in records:
        assert record["prompt"][0] == {"role": "system", "content": BEST}
        assert (
            record["prompt"][1:5] == TURNS
            and len(record["prompt"]) == 6
            and record["prompt"][5]["role"] == "user"
        )

    proc = workbench("gepa", "apply", str(run), cwd=tmp_path)  # again: nothing to change, nothing rewritten
    before = env_file.read_text()
    out, _ = finish(proc)
    assert proc.returncode == 0 and "already hold this prompt and these few-shot turns" in " ".join(
        out.split()
    )
    assert env_file.read_text() == before


def test_apply_without_a_few_shot_parameter_writes_nothing(tmp_path: Path):
    env_dir = tmp_path / "environments" / "my_env"
    env_dir.mkdir(parents=True)
    source = env_dir / "my_env.py"
    original = (
        'SYSTEM_PROMPT = "old"\n\n\ndef load_environment(system_prompt: str = SYSTEM_PROMPT):\n'
        "    raise NotImplementedError\n"
    )
    source.write_text(original)
    run = make_dspy_run(tmp_path, "my-env")
    proc = workbench("gepa", "apply", str(run), cwd=tmp_path)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert source.read_text() == original  # not even the prompt: all or nothing
    lines = out.strip().splitlines()
    assert lines[0].startswith("not written:") and "no `few_shot` parameter" in lines[0]
    command = next(line for line in lines if line.startswith("workbench eval run my-env"))
    assert '"system_prompt"' in command and '"few_shot"' in command and "xof der" in command


def test_apply_to_a_bundled_env_prints_both_arguments(tmp_path: Path):
    run = make_dspy_run(tmp_path)  # no workspace copy of reverse-text: the bundled (or installed) one
    proc = workbench("gepa", "apply", str(run), cwd=tmp_path)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert (
        "not a file of this workspace" in out and '"few_shot": [{"role": "user", "content": "red fox"}' in out
    )


def test_apply_system_demos_run_writes_only_the_prompt(tmp_path: Path):
    env_file = copy_reverse_text(tmp_path)
    run = make_dspy_run(tmp_path, demos_as="system")  # demos already rendered into best_prompt.txt
    proc = workbench("gepa", "apply", str(run), cwd=tmp_path)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert "few_shot" not in out and "few_shot: list[dict] | None = None" in env_file.read_text()


@pytest.mark.parametrize("turns", [TURNS, [], [{"role": "user", "content": "x" * 300 + "\n" + "y " * 80}]])
def test_few_shot_literal_round_trips(turns: list[dict[str, Any]]):
    for column in (0, 4, 36):
        assert ast.literal_eval(value_literal(turns, column)) == turns


def test_apply_defaults_rewrites_a_literal_default_in_place(workspace: Path):
    env_dir = workspace / "environments" / "my_env"
    env_dir.mkdir(parents=True)
    source = env_dir / "my_env.py"
    source.write_text(
        'def load_environment(n: int = 3, few_shot=None, *, system_prompt="old"):  # keep me\n    return n\n'
    )
    applied = apply_defaults("my-env", {"system_prompt": "new", "few_shot": TURNS[:2]})
    assert [(a.target, a.previous, a.changed) for a in applied] == [
        ("the default of system_prompt", "old", True),
        ("the default of few_shot", None, True),
    ]
    text = source.read_text()
    assert text.endswith("system_prompt='new'):  # keep me\n    return n\n")
    tree = ast.parse(text)
    assert [ast.literal_eval(d) for d in tree.body[0].args.defaults] == [3, TURNS[:2]]


# ----- verify ----------------------------------------------------------------------------------
def test_verify_best_side_carries_the_few_shot_turns(tmp_path: Path, policy_url: str):
    copy_reverse_text(tmp_path)
    run = make_dspy_run(tmp_path, policy_url=policy_url)
    # an env whose default already has the turns (an earlier `gepa apply`): the seed side must still go without
    proc = workbench("gepa", "apply", str(run), cwd=tmp_path)
    _, err = finish(proc)
    assert proc.returncode == 0, err
    proc = workbench("gepa", "verify", str(run), "-n", "4", "-r", "1", cwd=tmp_path)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert "held-out examples 10..13" in " ".join(out.split())
    seed, best = newest_results(tmp_path, count=2)
    assert all(r["prompt"][0] == {"role": "system", "content": SEED} and len(r["prompt"]) == 2 for r in seed)
    assert all(
        r["prompt"][0] == {"role": "system", "content": BEST} and r["prompt"][1:5] == TURNS for r in best
    )


# ----- TUI -------------------------------------------------------------------------------------
def test_tui_reader_shows_optimizer_and_few_shot(tmp_path: Path):
    run = load_gepa_run(make_dspy_run(tmp_path))
    assert run.optimizer == "miprov2" and run.optimizer_name == "MIPROv2"
    assert (
        run.candidates[0].few_shot == []
        and run.candidates[1].few_shot == TURNS
        and run.best_few_shot == TURNS
    )
    diff = run.prompt_diff()
    assert "+few-shot turns (4 messages):" in diff and "+  user: red fox" in diff and "+    xof der" in diff
    (run.path / "best_few_shot.json").unlink()  # the metadata's copy is enough
    assert load_gepa_run(run.path).best_few_shot == TURNS
    system = load_gepa_run(make_dspy_run(tmp_path, demos_as="system", run_id="20260102-030405-e6e6"))
    assert system.best_few_shot == []  # already in the prompt: not shown twice


async def test_tui_screen_shows_optimizer_and_turns(workspace: Path):
    from tests.test_tui_screens import SIZE, app_for, open_row
    from workbench.tui.screens.gepa import GepaScreen

    make_dspy_run(workspace)
    app = app_for(workspace)
    async with app.run_test(size=SIZE) as pilot:
        await open_row(pilot, app, lambda r: r.kind == "gepa")
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, GepaScreen)
        await wait_for(pilot, lambda: screen.gepa is not None)
        assert "MIPROv2" in text_of(screen.query_one("#gepa-title"))
        assert "+4 turns" in str(screen.query_one("#gepa-candidates").rows[1][4])
        await pilot.press("3")
        best = text_of(screen.query_one("#gepa-best"))
        assert (
            "few-shot turns (4 messages):" in best
            and "user: red fox" in best
            and "assistant: <reversed_text>" in best
        )
