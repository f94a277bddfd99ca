"""gsm8k: answer extraction and robust numeric comparison, the shipped GSM8K copy (exact, licensed,
read by default), data loading and seeded disjoint splits, hand-written completions, clear errors
without data, and `workbench eval run gsm8k` end to end."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from tests import cli
from tests.servers import EchoBackend, make_app, serve_in_thread
from workbench.envs import load_environment
from workbench.envs.environment import RolloutOutput
from workbench.envs.gsm8k_data import read_gsm8k_jsonl, shipped_gsm8k_path
from workbench.envs.math_answers import answers_match, extract_answer, extract_boxed, parse_number
from workbench.errors import UserError

pytestmark = pytest.mark.timeout(60)

GSM8K = shipped_gsm8k_path()  # GSM8K's train split, gzipped, in the bundled gsm8k environment
UPSTREAM_SHA256 = "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"  # data/ORIGIN.md


@pytest.mark.parametrize(
    "written",
    [
        "1000",
        "1,000",
        "1000.0",
        "$1000",
        "$1,000.00",
        "1000.",
        "\\$1{,}000",
        "1000 dollars",
        "x = 1000",
        "\\text{1000}",
        "1e3",
        " 1000 ",
    ],
)
def test_numeric_comparison_is_robust(written):
    assert answers_match(written, "1000")


@pytest.mark.parametrize("written", ["100", "10,00", "2,3", "1000.5", "one thousand", "", "1000 and 2000"])
def test_numeric_comparison_rejects_wrong_or_ambiguous(written):
    assert not answers_match(written, "1000" if written != "2,3" else "23")


def test_fractions_and_non_numeric_answers():
    assert (
        answers_match("\\frac{3}{4}", "0.75") and answers_match("3/4", "0.75") and answers_match("-7", "-7.0")
    )
    assert parse_number("50%") == 50 and parse_number("abc") is None and parse_number(None) is None
    assert answers_match("Paris", "paris") and not answers_match(None, "1")


def test_answer_extraction():
    assert extract_boxed("so \\boxed{\\frac{1}{2}} and \\boxed{42}") == "42"
    assert extract_boxed("cut off \\boxed{4") is None and extract_boxed("none") is None
    assert extract_answer("She sold 48 + 24 = 72 clips, earning $1,250.") == "1,250"
    assert extract_answer("<think>maybe \\boxed{5}</think> The answer is 6.") == "6"
    assert extract_answer("no digits here") is None


def test_shipped_copy_is_upstream_byte_for_byte_with_its_licence():
    assert GSM8K.name == "train.jsonl.gz" and GSM8K.parent.parent.name == "gsm8k"
    assert hashlib.sha256(gzip.decompress(GSM8K.read_bytes())).hexdigest() == UPSTREAM_SHA256
    licence = (GSM8K.parent / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "Copyright (c) 2021 OpenAI" in licence
    assert UPSTREAM_SHA256 in (GSM8K.parent / "ORIGIN.md").read_text()


def test_no_arguments_reads_the_shipped_copy_offline(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # no hub library: nothing is downloaded
    default = load_environment("gsm8k")
    explicit = load_environment("gsm8k", data_path=str(GSM8K))
    assert len(default.get_examples(split="train")) == 7473 - 200
    assert [e.prompt for e in default.get_examples()] == [e.prompt for e in explicit.get_examples()]


def test_data_file_rows_and_seeded_disjoint_split():
    rows = read_gsm8k_jsonl(GSM8K)
    assert len(rows) == 7473 and rows[0]["answer"] == "72" and "####" in rows[0]["info"]["solution"]
    env = load_environment("gsm8k", data_path=str(GSM8K))
    train, evals = env.get_examples(split="train"), env.get_examples(split="eval")
    assert len(evals) == 200 and len(train) == 7473 - 200
    assert not {e.prompt[-1]["content"] for e in evals} & {e.prompt[-1]["content"] for e in train}
    again = load_environment("gsm8k", data_path=str(GSM8K)).get_examples(5)
    assert [e.prompt for e in again] == [e.prompt for e in evals[:5]]  # seeded: same split every time
    other = load_environment("gsm8k", data_path=str(GSM8K), seed=1).get_examples(5)
    assert [e.prompt for e in other] != [e.prompt for e in evals[:5]]


def test_eval_file_and_sizes(tmp_path: Path):
    eval_file = tmp_path / "test.jsonl"
    eval_file.write_text(
        '{"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\\n#### 4"}\n\n'
        '{"question": "How many?", "answer": "#### 1,200"}\n'
    )
    env = load_environment(
        "gsm8k", data_path=str(GSM8K), eval_data_path=str(eval_file), num_train_examples=10
    )
    assert [e.answer for e in env.get_examples()] == ["4", "1200"]
    assert len(env.get_examples(split="train")) == 10
    no_holdout = load_environment("gsm8k", data_path=str(GSM8K), num_eval_examples=0, num_train_examples=3)
    assert len(no_holdout.get_examples(split="eval")) == 3  # eval falls back to train


def test_missing_data_is_a_clear_one_line_error(monkeypatch, tmp_path: Path):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if `datasets` were not installed
    with pytest.raises(UserError, match=r"pip install datasets.*data_path") as info:
        load_environment("gsm8k", from_hub=True)
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="from_hub loads openai/gsm8k"):
        load_environment("gsm8k", from_hub=True, data_path=str(GSM8K))
    with pytest.raises(UserError, match="data file not found"):
        load_environment("gsm8k", data_path=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "no answer"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object"):
        read_gsm8k_jsonl(bad)


def test_owner_prefix_resolves():
    env = load_environment("primeintellect/gsm8k", data_path=str(GSM8K), num_eval_examples=5)
    assert env.env_id == "gsm8k" and len(env.get_examples()) == 5


async def test_hand_written_completions_score():
    env = load_environment("gsm8k", data_path=str(GSM8K), num_eval_examples=5)
    example = env.get_examples(1)[0]
    answer = int(example.answer)

    def reply(text):
        return RolloutOutput([{"role": "assistant", "content": text}], {})

    cases = [
        reply(f"Step by step... so the total is \\boxed{{{answer:,}}}."),  # 1: boxed, with a comma
        reply(f"Adding it all up gives ${answer}.00 in the end."),  # 1: final-number fallback
        reply(f"The answer is \\boxed{{{answer + 1}}}."),  # 0: wrong
        reply("I am not sure."),  # 0: no number
        reply("\\boxed{"),  # 0: malformed
        RolloutOutput([{"role": "assistant", "content": None}], {}),  # 0: empty message
        RolloutOutput([], {}),  # 0: no assistant message at all
    ]
    scores = await env.score_group(example, cases)
    assert [s.reward for s in scores] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [s.metrics["format_reward"] for s in scores[:3]] == [1.0, 0.0, 1.0]
    assert all(s.error is None for s in scores)


async def test_reference_completions_score_one():
    env = load_environment("gsm8k", data_path=str(GSM8K), num_eval_examples=20)
    examples = env.get_examples()
    outputs = [RolloutOutput(env.reference_completion(e), {}) for e in examples]
    for example, output in zip(examples, outputs, strict=True):
        assert "<<" not in output.completion[0]["content"]
        assert (await env.score_group(example, [output]))[0].reward == 1.0


@pytest.mark.timeout(180)
def test_eval_run_end_to_end(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}
    with serve_in_thread(make_app(EchoBackend())) as url:
        proc = cli.run(
            [
                sys.executable,
                "-m",
                "workbench",
                "eval",
                "run",
                "primeintellect/gsm8k",
                "-m",
                "echo",
                "-b",
                f"{url}/v1",
                "-n",
                "4",
                "-r",
                "2",
                "-a",
                json.dumps({"data_path": str(GSM8K)}),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )
    assert proc.returncode == 0, proc.stderr
    run_dir = next((tmp_path / "environments" / "gsm8k" / "outputs" / "evals" / "gsm8k--echo").iterdir())
    records = [
        json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()
    ]
    assert len(records) == 8 and {r["example_id"] for r in records} == {0, 1, 2, 3}
    assert all(set(r["rewards"]) == {"correct_answer"} and r["error"] is None for r in records)
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "finished"
