"""After `gepa run`: `gepa apply` makes the best prompt the environment's default (a plain
`eval run` then uses it) and `gepa verify` scores seed vs best on held-out examples with a
confidence interval. End to end over HTTP with the scripted policy and reflection servers of
tests/test_gepa.py (test doubles: a program whose accuracy depends on its prompt), in a
workspace that holds its own copy of the reverse-text environment."""

from __future__ import annotations

import ast
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ScriptedBackend, make_app, serve_in_thread
from tests.test_cli_errors import assert_one_line_error
from tests.test_cli_errors import workbench as run_cli
from tests.test_gepa import KEYWORD, LEVELS, Policy, Reflection, finish, gepa_args, only_run, workbench
from workbench.engine.paired import paired_difference
from workbench.gepa.apply import apply_prompt, prompt_literal

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A finished GEPA run (best prompt found) in a workspace with an editable reverse-text env,
    and the policy server, kept up for the commands that follow."""
    root = tmp_path_factory.mktemp("apply")
    env_dir = root / "environments" / "reverse_text"
    env_dir.mkdir(parents=True)
    shutil.copy(REPO / "environments" / "reverse_text" / "reverse_text.py", env_dir / "reverse_text.py")
    policy, reflection = Policy(), Reflection()
    with (
        serve_in_thread(make_app(ScriptedBackend(policy, model="policy"))) as p_url,
        serve_in_thread(make_app(ScriptedBackend(reflection, model="reflect"))) as r_url,
    ):
        proc = workbench(*gepa_args(p_url, r_url, "-B", "150", "--seed", "3"), cwd=root)
        out, err = finish(proc)
        assert proc.returncode == 0, err
        assert "workbench gepa verify" in out and "workbench gepa apply" in out
        yield {
            "root": root,
            "run": only_run(root),
            "policy_url": f"{p_url}/v1",
            "env_file": env_dir / "reverse_text.py",
        }


def test_apply_makes_the_best_prompt_the_default(optimized: dict):
    run, env_file = optimized["run"], optimized["env_file"]
    best = (run / "best_prompt.txt").read_text().rstrip("\n")
    before = env_file.read_text()
    proc = workbench("gepa", "apply", str(run), cwd=optimized["root"])
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert "SYSTEM_PROMPT" in out and str(env_file) in " ".join(out.split())
    after = env_file.read_text()
    tree = ast.parse(after)
    constant = next(
        n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "SYSTEM_PROMPT"
    )
    assert ast.literal_eval(constant) == best and best.count(KEYWORD) == LEVELS
    # only that expression changed: the rest of the file is as it was
    assert after.replace(ast.get_source_segment(after, constant), "X") == before.replace(
        ast.get_source_segment(
            before,
            next(
                n.value
                for n in ast.parse(before).body
                if isinstance(n, ast.Assign) and n.targets[0].id == "SYSTEM_PROMPT"
            ),
        ),
        "X",
    )

    # round trip: an eval with no -a now sends the best prompt (and the scripted policy, told
    # KEYWORD often enough, reverses every text)
    proc = workbench(
        "eval",
        "run",
        "reverse-text",
        "-m",
        "policy",
        "-b",
        optimized["policy_url"],
        "-n",
        "4",
        "-r",
        "1",
        cwd=optimized["root"],
    )
    out, err = finish(proc)
    assert proc.returncode == 0, err
    results = sorted(
        (optimized["root"] / "environments" / "reverse_text" / "outputs" / "evals").glob("*/*/results.jsonl")
    )
    records = [json.loads(line) for line in results[-1].read_text().splitlines()]
    assert all(r["prompt"][0] == {"role": "system", "content": best} for r in records)
    assert all(r["reward"] == pytest.approx(1.0) for r in records)

    proc = workbench("gepa", "apply", str(run), cwd=optimized["root"])  # again: nothing to change
    out, _ = finish(proc)
    assert proc.returncode == 0 and "already is this prompt" in out


def test_verify_scores_seed_and_best_on_held_out_examples(optimized: dict):
    run = optimized["run"]
    proc = workbench(
        "gepa",
        "verify",
        str(run),
        "-n",
        "12",
        "-r",
        "1",
        "-b",
        optimized["policy_url"],
        "-m",
        "policy",
        cwd=optimized["root"],
    )
    out, err = finish(proc)
    assert proc.returncode == 0, err
    text = " ".join(out.split())
    assert (
        "held-out examples 10..21" in text and "(n=12, r=1, seed 3)" in text
    )  # GEPA validated on 0..9 (-N 10)
    assert "better" in text and "95% CI +" in text
    evals = sorted(
        (optimized["root"] / "environments" / "reverse_text" / "outputs" / "evals").glob("*/*/metadata.json"),
        key=lambda p: p.stat().st_mtime,
    )[-2:]
    configs = [json.loads(p.read_text())["config"] for p in evals]
    assert [c["example_offset"] for c in configs] == [10, 10] and configs[0]["seed"] == configs[1][
        "seed"
    ] == 3
    assert (
        KEYWORD not in configs[0]["env_args"]["system_prompt"]
        and KEYWORD in configs[1]["env_args"]["system_prompt"]
    )


def test_verify_and_apply_mistakes_are_one_line(optimized: dict, tmp_path: Path):
    for args, needle in (
        (["gepa", "verify", str(tmp_path / "nope")], "nope"),
        (["gepa", "apply", str(tmp_path / "nope")], "nope"),
        (["gepa", "verify", str(optimized["run"]), "-n", "0"], "at least 1"),
    ):
        assert_one_line_error(run_cli(*args, cwd=optimized["root"]), needle)


# ----- the pieces ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompt",
    [
        "plain",
        "two\nlines",
        'ends with a quote"',
        'has """ inside\nand \\ slashes',
        'it\'s "quoted"\n\ttabbed',
        "trailing newline\n",
    ],
)
def test_prompt_literal_round_trips(prompt: str):
    assert ast.literal_eval(prompt_literal(prompt)) == prompt


def test_apply_rewrites_a_parenthesized_constant_or_a_literal_default(workspace: Path):
    env_dir = workspace / "environments" / "my_env"
    env_dir.mkdir(parents=True)
    source = env_dir / "my_env.py"
    source.write_text(
        '# header\nDEFAULT_SYSTEM_PROMPT = (\n    "Be brief. "\n    "Be right."\n)  # keep me\n\n\n'
        "def load_environment(n: int = 3, system_prompt: str = DEFAULT_SYSTEM_PROMPT):\n    return n\n"
    )
    applied = apply_prompt("my-env", "New\nprompt")
    assert (
        applied.path == source
        and applied.target == "DEFAULT_SYSTEM_PROMPT"
        and applied.previous == "Be brief. Be right."
    )
    assert source.read_text().startswith(
        '# header\nDEFAULT_SYSTEM_PROMPT = (\n    """New\nprompt"""\n)  # keep me\n'
    )
    source.write_text('def load_environment(*, system_prompt="old"):\n    return system_prompt\n')
    applied = apply_prompt("my-env", "new")
    assert applied.previous == "old" and "system_prompt='new'" in source.read_text()


def test_apply_leaves_bundled_environments_alone(workspace: Path):
    # no workspace copy: the bundled one, or an installed package when an earlier test of the
    # suite installed one (test_env_install does); neither is edited
    applied = apply_prompt("reverse-text", "anything")
    assert applied.path is None and "not a file of this workspace" in applied.reason


def test_paired_difference_interval_and_verdicts():
    a = {i: 0.2 + 0.01 * i for i in range(30)}
    better = paired_difference(a, {i: v + 0.1 for i, v in a.items()})
    assert better.n == 30 and better.diff == pytest.approx(0.1) and better.low == pytest.approx(0.1)
    assert better.verdict == "better"
    noisy = paired_difference(a, {i: v + (0.3 if i % 2 else -0.3) for i, v in a.items()})
    assert noisy.low < 0 < noisy.high and noisy.verdict == "no clear difference"
    assert (
        paired_difference({1: 1.0, 2: 1.0}, {2: 0.0, 3: 1.0}).verdict == "worse"
    )  # only example 2 is shared
    with pytest.raises(ValueError):
        paired_difference({1: 1.0}, {2: 1.0})
