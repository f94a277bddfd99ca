"""Port by one import, scoring side: the parsers, rubrics and data helpers a verifiers environment
uses (`vf.Parser(extract_fn=...)`, `vf.XMLParser`, `vf.ThinkParser`, `vf.MaybeThinkParser`,
`vf.MathRubric`, `vf.RubricGroup`, `vf.JudgeRubric(judge_client=AsyncOpenAI(...))`,
`verifiers.utils.data_utils`) behave as verifiers' do when imported from `workbench.envs`."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

import workbench.envs as vf
from tests.servers import ScriptedBackend, make_app, serve_in_thread
from workbench.envs.gsm8k_data import shipped_gsm8k_path
from workbench.envs.rubric import ScoringInput
from workbench.envs.utils.data_utils import (
    BOXED_SYSTEM_PROMPT,
    THINK_BOXED_SYSTEM_PROMPT,
    extract_boxed_answer,
    extract_hash_answer,
    load_example_dataset,
)
from workbench.types import Completion, Messages, SamplingParams


class AttrMessage(dict):
    """A message that is a dict and also reads as attributes (`m.role`), as verifiers' are."""

    def __getattr__(self, name: str) -> Any:
        return self.get(name)


def said(text: str) -> Messages:
    return [{"role": "assistant", "content": text}]


def item(completion: Messages, answer: str = "", prompt: str = "What is half of one?") -> ScoringInput:
    return ScoringInput(
        prompt=[{"role": "user", "content": prompt}], completion=completion, answer=answer, state={}
    )


# --- parsers -----------------------------------------------------------------------------------


def test_parser_applies_extract_fn_to_the_last_assistant_message_of_any_message_kind():
    parser = vf.Parser(extract_fn=extract_boxed_answer)
    conversation = [
        AttrMessage(role="user", content="q"),
        AttrMessage(role="assistant", content="first \\boxed{1}"),
        AttrMessage(role="user", content="sure?"),
        {"role": "assistant", "content": [{"type": "text", "text": "so \\boxed{\\frac{1}{2}}"}]},
    ]
    assert parser.parse_answer(conversation) == "\\frac{1}{2}"
    assert parser.parse_answer("plain \\boxed{7}") == "7"
    assert parser.parse_answer([{"role": "user", "content": "\\boxed{3}"}]) is None  # no assistant message
    assert [m["content"] for m in parser.get_user_messages(conversation)] == ["q", "sure?"]
    assert len(parser.get_assistant_messages(conversation)) == 2
    assert vf.Parser().parse_answer(said("  42 \n")) == "42"  # no extract_fn: the text, stripped


def test_xml_parser_as_verifiers_constructs_it():
    parser = vf.XMLParser(["think", "answer"], answer_field="answer")
    assert parser.parse_answer(said("<think>hmm</think><answer> 42 </answer>")) == "42"
    assert parser.get_fields() == ["think", "answer"]
    # verifiers' default answer field is "answer", wherever it sits among the fields
    assert (
        vf.XMLParser(["answer", "confidence"]).parse_answer(
            said("<answer>7</answer><confidence>0.9</confidence>")
        )
        == "7"
    )
    assert (
        vf.XMLParser(fields=["grade"], answer_field="grade").parse_answer(
            "<scratchpad>ok</scratchpad><grade>B</grade>"
        )
        == "B"
    )
    alt = vf.XMLParser(["reasoning", ("code", "answer")]).parse("<reasoning>r</reasoning><answer>5</answer>")
    assert (alt.reasoning, alt.code, alt.answer) == ("r", "5", "5")
    with pytest.raises(ValueError, match="duplicate field 'a'"):
        vf.XMLParser(["a", ("a", "b")])


def test_think_and_maybe_think_parsers():
    think = vf.ThinkParser(extract_fn=extract_boxed_answer)
    assert think.parse_answer(said("<think>2+2</think> so \\boxed{4}")) == "4"
    assert think.parse_answer(said("<think>cut off mid-thought \\boxed{4}")) is None
    score = think.get_format_reward_func()
    assert (
        score(said("<think>a</think> b")) == 1.0 and score(said("<think>a</think><think>b</think> c")) == 0.0
    )
    maybe = vf.MaybeThinkParser(extract_fn=lambda text: text.upper())
    assert maybe.parse_answer(said("<think>x</think> yes")) == "YES"
    assert maybe.parse_answer(said("no thinking")) == "NO THINKING"


# --- rubrics -----------------------------------------------------------------------------------


async def test_rubric_takes_verifiers_keywords_metrics_class_objects_and_records_errors():
    def exact(parser, completion, answer) -> float:
        return float(parser.parse_answer(completion) == answer)

    def uses_tool(completion, lookup, **kwargs) -> float:
        return lookup[parser.parse_answer(completion)]

    def broken(completion) -> float:
        raise RuntimeError("bad regex")

    parser = vf.Parser(extract_fn=extract_boxed_answer)
    rubric = vf.Rubric(funcs=[exact], weights=[], parser=parser)  # [] weights: 1.0 each, as in verifiers
    rubric.add_metric(uses_tool)
    rubric.add_class_object("lookup", {"3": 0.25, "4": 0.5})
    ok, wrong = await rubric.score_group([item(said("\\boxed{4}"), "4"), item(said("\\boxed{3}"), "4")])
    assert (ok.reward, ok.rewards, ok.metrics) == (1.0, {"exact": 1.0}, {"uses_tool": 0.5})
    assert (wrong.reward, wrong.metrics) == (0.0, {"uses_tool": 0.25})
    assert vf.Rubric(funcs=None).funcs == []

    rubric.add_reward_func(broken, weight=0.5)
    (failed,) = await rubric.score_group([item(said("\\boxed{4}"), "4")])
    assert failed.reward == 0.0 and failed.error is not None
    assert (
        failed.error.where == "reward"
        and "broken" in failed.error.message
        and "bad regex" in failed.error.message
    )


async def test_math_rubric_checks_the_boxed_answer_mathematically():
    rubric = vf.MathRubric()
    assert rubric.func_names == ["correct_answer"]
    cases = [
        ("so \\boxed{1/2}", "0.5", 1.0),
        ("so \\boxed{1/3}", "0.5", 0.0),
        ("the answer is 0.5", "0.5", 0.0),
        ("<think>hmm \\boxed{9}</think> \\boxed{\\dfrac12}", "\\frac{1}{2}", 1.0),
        ("\\boxed{25 \\pi}", "25\\pi", 1.0),
        ("\\boxed{25}", "25\\pi", 0.0),
        ("\\boxed{1{,}000}", "1000", 1.0),
        ("\\boxed{1e999999999}", "1", 0.0),
    ]  # huge exponents are not expanded (that would hang)
    scores = await rubric.score_group([item(said(text), answer) for text, answer, _ in cases])
    assert [s.rewards["correct_answer"] for s in scores] == [want for _, _, want in cases]
    assert all(s.error is None for s in scores)
    assert isinstance(rubric.parser, vf.MaybeThinkParser)


async def test_rubric_group_sums_rewards_and_names_every_members_columns():
    def contains_half(completion) -> float:
        return float("half" in completion[-1]["content"])

    def length(completion) -> float:
        return float(len(completion[-1]["content"]))

    group = vf.RubricGroup(
        rubrics=[vf.MathRubric(), vf.Rubric(funcs=[contains_half, length], weights=[0.5, 0.0])]
    )
    assert group.func_names == ["correct_answer", "contains_half", "length"]
    right, wrong = await group.score_group(
        [item(said("half: \\boxed{0.5}"), "1/2"), item(said("\\boxed{2}"), "1/2")]
    )
    assert right.reward == 1.5 and right.rewards == {"correct_answer": 1.0, "contains_half": 1.0}
    assert right.metrics == {"length": 17.0}
    assert wrong.reward == 0.0 and wrong.rewards == {"correct_answer": 0.0, "contains_half": 0.0}

    def broken(completion) -> float:
        raise KeyError("info")

    group.add_reward_func(broken)  # as in verifiers: goes to the first member
    (failed,) = await group.score_group([item(said("half: \\boxed{0.5}"), "1/2")])
    assert failed.reward == 0.0 and "broken" in failed.error.message and failed.rewards["broken"] == 0.0
    with pytest.raises(ValueError, match="at least one rubric"):
        vf.RubricGroup(rubrics=[])


# --- JudgeRubric with an openai.AsyncOpenAI client, over real HTTP -------------------------------


def grading_judge(requests: list[tuple[Messages, SamplingParams]]) -> ScriptedBackend:
    """A judge server that grades A when the response contains the true answer, else F."""

    def script(messages: Messages, sampling: SamplingParams, tools: Any) -> list[Completion]:
        requests.append((messages, sampling))
        text = messages[-1]["content"]
        truth = text.split("<answer>")[1].split("</answer>")[0]
        response = text.split("<response>")[1].split("</response>")[0]
        grade = "A" if truth in response else "F"
        return [
            Completion(
                message={
                    "role": "assistant",
                    "content": f"<scratchpad>ok</scratchpad><grade>{grade}</grade>",
                },
                finish_reason="stop",
            )
        ]

    return ScriptedBackend(script, model="judge-model")


JUDGE_PROMPT = "Q: {question}\n<answer>{answer}</answer>\n<response>{response}</response>\nGrade it."


async def test_judge_rubric_with_an_async_openai_client():
    requests: list[tuple[Messages, SamplingParams]] = []
    grade_parser = vf.XMLParser(fields=["grade"], answer_field="grade")

    async def grade_reward(judge, prompt, completion, answer, state) -> float:  # continuation_quality's shape
        first = await judge(prompt, completion, answer, state)
        again = await judge(prompt, completion, answer, state)  # cached: one request
        assert again == first
        return {"A": 1.0, "B": 0.75}.get((grade_parser.parse_answer(first) or "F").strip(), 0.0)

    with serve_in_thread(make_app(grading_judge(requests))) as url:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="not-a-secret", max_retries=0)
        rubric = vf.JudgeRubric(
            judge_client=client,
            judge_model="judge-model",
            judge_prompt=JUDGE_PROMPT,
            judge_sampling_args={"max_tokens": 300, "temperature": 0.2},
        )
        rubric.add_reward_func(grade_reward, weight=1.0)
        good, bad = await rubric.score_group(
            [
                item(said("It is Vell."), "Vell", prompt="Capital of Xia?"),
                item(said("No idea."), "Vell", prompt="Capital of Xia?"),
            ]
        )
        await client.close()
    assert (good.reward, bad.reward) == (1.0, 0.0) and good.error is None and bad.error is None
    assert len(requests) == 2
    messages, sampling = requests[0]
    assert messages == [
        {
            "role": "user",
            "content": JUDGE_PROMPT.format(question="Capital of Xia?", answer="Vell", response="It is Vell."),
        }
    ]
    assert (sampling.max_tokens, sampling.temperature) == (300, 0.2)  # sent as max_completion_tokens
    assert rubric.judge_model == "judge-model" and rubric.judge_client is client


async def test_judge_rubric_with_an_unreachable_async_openai_client_records_the_error():
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0)
    rubric = vf.JudgeRubric(judge_client=client, judge_model="gone")
    rubric.add_reward_func(rubric.judge_reward)
    (score,) = await rubric.score_group([item(said("Vell"), "Vell")])
    await client.close()
    assert score.reward == 0.0 and score.error is not None
    assert (
        "judge_reward" in score.error.message
        and "judge 'gone' at http://127.0.0.1:9/v1" in score.error.message
    )


# --- verifiers.utils.data_utils ------------------------------------------------------------------


def test_answer_extractors_and_prompts():
    assert extract_boxed_answer("a \\boxed{1} then \\boxed{\\frac{2}{3}}.") == "\\frac{2}{3}"
    assert extract_boxed_answer("no box") == "no box" and extract_boxed_answer("no box", strict=True) == ""
    assert extract_boxed_answer("cut \\boxed{1{2}", strict=True) == ""
    assert extract_hash_answer("48/2 = 24\n#### 72") == "72" and extract_hash_answer("72") == "72"
    assert "\\boxed{}" in BOXED_SYSTEM_PROMPT and "<think>" in THINK_BOXED_SYSTEM_PROMPT
    assert vf.extract_boxed_answer is extract_boxed_answer and vf.load_example_dataset is load_example_dataset


@pytest.fixture
def gsm8k_dir(tmp_path: Path) -> Path:
    """A WORKBENCH_DATA_DIR holding gsm8k/train.jsonl: the GSM8K copy shipped with workbench, unzipped."""
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.jsonl").write_bytes(gzip.decompress(shipped_gsm8k_path().read_bytes()))
    return tmp_path


def test_load_example_dataset_reads_a_gsm8k_file(monkeypatch: pytest.MonkeyPatch, gsm8k_dir: Path):
    pytest.importorskip("datasets")
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(gsm8k_dir))
    raw = [json.loads(line) for line in (gsm8k_dir / "gsm8k" / "train.jsonl").read_text().splitlines()]
    data = load_example_dataset("gsm8k", split="train")
    assert len(data) == len(raw) == 7473 and data.column_names == ["question", "answer"]
    assert data[0] == {"question": raw[0]["question"], "answer": "72"}
    sample = load_example_dataset("gsm8k", split="train", n=5, seed=3)
    assert len(sample) == 5 and sample[:] == load_example_dataset("gsm8k", split="train", n=5, seed=3)[:]
    by_question = {row["question"]: row["answer"] for row in raw}
    assert all(
        by_question[q].endswith(f"#### {a}")
        for q, a in zip(sample["question"], sample["answer"], strict=True)
    )
    mapped = sample.map(
        lambda row: {"prompt": [{"role": "user", "content": row["question"]}]}
    )  # what envs do with it
    assert mapped[0]["prompt"][0]["content"] == sample[0]["question"]


def test_load_example_dataset_missing_file_and_unknown_name(
    monkeypatch: pytest.MonkeyPatch, workspace: Path, gsm8k_dir: Path
):
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(gsm8k_dir))
    with pytest.raises(FileNotFoundError) as missing:  # verifiers' default gsm8k split is "test"
        load_example_dataset("gsm8k")
    message = str(missing.value)
    assert (
        "\n" not in message
        and str(gsm8k_dir / "gsm8k" / "test.jsonl") in message
        and "WORKBENCH_DATA_DIR" in message
    )
    with pytest.raises(ValueError, match="unknown example dataset 'gsm9k'"):
        load_example_dataset("gsm9k")


def test_load_example_dataset_from_the_workspace_without_datasets(
    monkeypatch: pytest.MonkeyPatch, workspace: Path
):
    monkeypatch.delenv("WORKBENCH_DATA_DIR", raising=False)
    (workspace / "data" / "math").mkdir(parents=True)
    rows = [{"problem": "Half of one?", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1"}]
    (workspace / "data" / "math" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setitem(
        sys.modules, "datasets", None
    )  # `import datasets` now fails: rows come back as a list
    assert load_example_dataset("math") == [{"question": "Half of one?", "answer": "\\frac{1}{2}"}]
