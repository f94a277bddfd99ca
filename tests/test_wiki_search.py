"""wiki-search: the generated encyclopedia needs search (multi-hop, seeded), the FTS5/BM25 index
and its tools, user corpora (.md/.txt folder, JSONL) with questions, exact-match rewards on
hand-written answers, the JudgeRubric against a real judge over HTTP, an eval through the CLI
(owner-prefixed id) and an EnvGroup with wordle through the engine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.servers import EchoBackend, ScriptedBackend, make_app, serve_in_thread
from tests.test_cli_errors import workbench
from workbench.engine import run_rollouts
from workbench.envs import EnvGroup, load_environment
from workbench.envs.environment import RolloutOutput
from workbench.envs.judge import JudgeRubric
from workbench.envs.loader import find_environment, import_env_module
from workbench.errors import UserError
from workbench.inference.echo import EchoClient
from workbench.inference.openai_client import OpenAIClient
from workbench.types import Completion, SamplingParams

wiki = import_env_module(find_environment("wiki-search"))


class ScriptedClient:
    """Replays fixed assistant messages, one per call."""

    model = "scripted"

    def __init__(self, messages: list[dict]) -> None:
        self.messages = list(messages)

    async def chat(self, messages, *, sampling, tools=None):
        message = self.messages.pop(0)
        return [
            Completion(message=message, finish_reason="tool_calls" if message.get("tool_calls") else "stop")
        ]

    async def close(self) -> None:
        pass


def answer(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def env():
    return load_environment("wiki-search")


def test_generated_encyclopedia_is_seeded_and_splits_are_disjoint(env):
    again, other = load_environment("wiki-search"), load_environment("wiki-search", seed=1)
    questions = [e.prompt[-1]["content"] for e in env.get_examples(-1)]
    train = [e.prompt[-1]["content"] for e in env.get_examples(-1, split="train")]
    assert len(questions) == 100 and len(train) > 300 and not set(questions) & set(train)
    assert questions == [e.prompt[-1]["content"] for e in again.get_examples(-1)]
    assert questions != [e.prompt[-1]["content"] for e in other.get_examples(-1)]
    assert sorted(env.index.pages) == sorted(again.index.pages)


def test_every_question_is_answerable_only_by_searching(env):
    multi_hop = 0
    for example in env.get_examples(-1):
        hops = example.info["hops"]
        question = example.prompt[-1]["content"]
        assert example.answer.lower() not in question.lower()
        last = env.index.sections[hops[-1]].text
        assert wiki.normalize_answer(example.answer) in wiki.normalize_answer(
            last
        )  # the fact is where the path ends
        if len(hops) > 1:  # the answer is not on the first page the question names
            multi_hop += 1
            first_page = env.index.pages[hops[0].split(":")[0]]
            assert all(example.answer not in s.text for s in first_page.sections)
        # the page the question names is found by searching for it
        first_title = env.index.pages[hops[0].split(":")[0]].title
        assert env.index.search(first_title)[0][0] == hops[0].split(":")[0]
    assert multi_hop >= 30


def test_tools_search_view_read_and_hostile_queries(env):
    page = next(
        p
        for p in env.index.pages.values()
        if p.page_id.endswith("press") or p.page_id.endswith("lathe") or p.page_id.endswith("wheel")
    )  # an invention's page
    hits = env.index.search_pages(page.title)
    assert hits.splitlines()[0].startswith(f"{page.page_id} | {page.title} |")
    listing = env.index.view_sections(page.page_id)
    assert f"{page.page_id}:history | History" in listing
    assert "invented by" in env.index.read_section(f"{page.page_id}:history")
    assert env.index.view_sections(page.title) == listing  # a title works as a page id too
    for query in ('"unbalanced', "AND OR NOT", "a* (b) c:d ^e", "", "the of in"):
        env.index.search_pages(query)  # FTS5 syntax in user text never raises
    assert env.index.search_pages("") == "No pages found. Try other words."
    with pytest.raises(KeyError, match="no page"):
        env.index.view_sections("no-such-page")
    with pytest.raises(KeyError, match="no section"):
        env.index.read_section("nope:nothing")


async def test_hand_written_answers(env):
    example = next(e for e in env.get_examples(-1) if " " in e.answer)
    variants = {
        "exact": answer(f"<answer>{example.answer}</answer>"),
        "normalized": answer(f"Found it.\n<answer> the {example.answer.upper()}. </answer>"),
        "wrong": answer("<answer>Nobody</answer>"),
        "untagged": answer(example.answer),  # right words, no tags: not an answer
        "malformed": answer("<answer>unclosed"),
        "empty": [],
    }
    scores = await env.score_group(example, [RolloutOutput(c, {}) for c in variants.values()])
    rewards = dict(zip(variants, (s.reward for s in scores), strict=True))
    assert rewards == {
        "exact": 1.0,
        "normalized": 1.0,
        "wrong": 0.0,
        "untagged": 0.0,
        "malformed": 0.0,
        "empty": 0.0,
    }
    assert scores[0].metrics["format_reward"] == 1.0 and all(s.error is None for s in scores)


async def test_reference_trajectory_through_the_tool_loop_scores_one(env):
    example = next(e for e in env.get_examples(-1) if len(e.info["hops"]) == 3)
    reference = env.reference_completion(example)
    client = ScriptedClient([m for m in reference if m["role"] == "assistant"])
    out = await env.rollout(client, example, SamplingParams())
    assert out.error is None and out.stop_condition == "completed"
    assert out.state["tool_calls"] == 6 and out.state["tool_errors"] == 0
    assert [m["content"] for m in out.completion if m["role"] == "tool"] == [
        m["content"] for m in reference if m["role"] == "tool"
    ]
    scores = await env.score_group(example, [out])
    assert scores[0].reward == 1.0 and scores[0].metrics["num_tool_calls"] == 6.0


def write_questions(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_user_folder_corpus_with_questions(tmp_path: Path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "lighthouse.md").write_text(
        "# Grey Point Lighthouse\nBuilt on a cliff.\n\n## Keepers\nThe last keeper was Ada Moss.\n"
        "## Lamp\nA paraffin lamp, later electric.\n"
    )
    (docs / "sub" / "harbour-notes.txt").write_text("The harbour freezes in February.")
    questions = write_questions(
        tmp_path / "q.jsonl",
        [
            {"question": "Who was the last keeper?", "answer": "Ada Moss"},
            {"question": "When does the harbour freeze?", "answer": "February"},
        ],
    )
    env = load_environment("wiki-search", corpus_path=str(docs), questions_path=str(questions))
    assert sorted(env.index.pages) == ["lighthouse", "sub-harbour-notes"]
    assert env.index.view_sections("lighthouse").splitlines() == [
        "Grey Point Lighthouse",
        "lighthouse:introduction | Introduction",
        "lighthouse:keepers | Keepers",
        "lighthouse:lamp | Lamp",
    ]
    assert env.index.search("keeper")[0][0] == "lighthouse"
    assert "Ada Moss" in env.index.read_section("lighthouse:keepers")
    assert env.index.search("harbour freezes")[0][1] == "harbour notes"
    assert {e.answer for e in env.get_examples(-1)} == {
        "Ada Moss",
        "February",
    }  # few questions: used for eval
    assert len(env.get_examples(-1, split="train")) == 2


def test_user_jsonl_corpus_text_and_sections(tmp_path: Path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        json.dumps({"title": "Moss Island", "text": "Intro text.\n## Fauna\nPuffins nest here."})
        + "\n"
        + json.dumps(
            {"id": "tides", "title": "Tides", "sections": [{"heading": "Spring", "text": "Big tides."}]}
        )
        + "\n"
    )
    questions = write_questions(
        tmp_path / "q.jsonl", [{"question": "What nests on Moss Island?", "answer": "puffins"}]
    )
    env = load_environment("wiki-search", corpus_path=str(corpus), questions_path=str(questions))
    assert env.index.read_section("moss-island:fauna") == "Fauna\nPuffins nest here."
    assert env.index.read_section("tides:spring") == "Spring\nBig tides."


def test_user_corpus_errors_are_clear(tmp_path: Path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"title": "x", "text": "y"}\n')
    with pytest.raises(UserError, match="corpus_path needs questions_path"):
        load_environment("wiki-search", corpus_path=str(corpus))
    with pytest.raises(UserError, match="corpus_path not found"):
        load_environment("wiki-search", corpus_path=str(tmp_path / "missing"), questions_path=str(corpus))
    bad = write_questions(tmp_path / "bad.jsonl", [{"q": "?"}])
    with pytest.raises(UserError, match=r"bad.jsonl:1: a question line needs 'question' and 'answer'"):
        load_environment("wiki-search", corpus_path=str(corpus), questions_path=str(bad))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no documents with text"):
        load_environment("wiki-search", corpus_path=str(tmp_path / "empty"), questions_path=str(bad))


def scripted_judge() -> ScriptedBackend:
    """A judge that says "yes" when the response contains the ground truth answer."""

    def script(messages, sampling, tools):
        prompt = messages[-1]["content"]
        truth = re.search(r"Ground truth answer:\n```\n(.*?)\n```", prompt, re.S).group(1)
        response = re.search(r"Response:\n```\n(.*?)\n```", prompt, re.S).group(1)
        verdict = "Yes." if truth.lower() in response.lower() else "no"
        return [Completion(message={"role": "assistant", "content": verdict}, finish_reason="stop")]

    return ScriptedBackend(script, model="judge")


async def test_judge_rubric_over_http_with_wiki_search():
    with serve_in_thread(make_app(scripted_judge())) as url:
        env = load_environment("wiki-search", judge_model="judge", judge_base_url=f"{url}/v1")
        judge_rubric = env.rubric.rubrics[
            0
        ]  # a ToolEnv's rubric: the env's own, then the tool metrics (as verifiers)
        assert isinstance(judge_rubric, JudgeRubric)
        example = env.get_examples(1)[0]
        variants = [
            answer(f"<answer>It is {example.answer}, I believe</answer>"),  # judge: yes; exact match: no
            answer("<answer>Nobody</answer>"),
            answer("no tags"),
        ]
        scores = await env.score_group(example, [RolloutOutput(c, {}) for c in variants])
        assert not judge_rubric.judge_client.connected  # closed when idle: nothing leaks at exit
    assert [s.reward for s in scores] == [1.0, 0.0, 0.0]
    assert scores[0].rewards == {"judge_reward": 1.0} and scores[0].metrics["exact_match_reward"] == 0.0
    assert all(s.metrics["total_tool_calls"] == 0.0 and "search_pages_calls" in s.metrics for s in scores)
    assert all(s.error is None for s in scores)


async def test_judge_argument_injection_cache_and_errors():
    with serve_in_thread(make_app(scripted_judge())) as url:
        client = OpenAIClient(f"{url}/v1", "judge")
        calls = []

        async def judged_twice(judge, prompt, completion, answer, state) -> float:
            first = await judge(prompt, completion, answer, state)
            calls.append(first)
            return float((await judge(prompt, completion, answer, state)) == first)

        rubric = JudgeRubric([judged_twice], judge_client=client)
        rubric.add_reward_func(rubric.judge_reward)
        from workbench.envs.rubric import ScoringInput

        item = ScoringInput(
            prompt=[{"role": "user", "content": "Capital of Xia?"}],
            completion=answer("Vell"),
            answer="Vell",
            state={},
        )
        scores = await rubric.score_group([item])
        assert (
            scores[0].reward == 2.0
            and list(item.state["judge_response"].values()) == ["Yes."]
            and calls == ["Yes."]
        )
        await client.close()
    # A judge that cannot be reached: that rollout scores 0 with the error recorded, no crash.
    down = JudgeRubric(judge_client=OpenAIClient("http://127.0.0.1:9/v1", "judge", timeout_s=5))
    down.add_reward_func(down.judge_reward)
    scores = await down.score_group([ScoringInput(prompt=[], completion=answer("x"), answer="y", state={})])
    assert scores[0].reward == 0.0 and "judge_reward" in scores[0].error.message
    await down.judge_client.close()


def test_judge_without_key_fails_at_load(monkeypatch: pytest.MonkeyPatch, workspace):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserError, match=r"judge model 'gpt-4.1-mini'.*OPENAI_API_KEY"):
        load_environment("wiki-search", judge_model="gpt-4.1-mini")


def test_eval_cli_with_owner_prefix_against_echo_server(tmp_path: Path):
    with serve_in_thread(make_app(EchoBackend())) as url:
        result = workbench(
            "eval",
            "run",
            "primeintellect/wiki-search",
            "-m",
            "echo",
            "-b",
            f"{url}/v1",
            "-n",
            "4",
            "-r",
            "2",
            "-C",
            "tool_calls",
            cwd=tmp_path,
        )
    assert result.returncode == 0, result.stderr
    runs = tmp_path / "environments" / "wiki_search" / "outputs" / "evals" / "wiki-search--echo"
    records = [json.loads(line) for line in (next(runs.iterdir()) / "results.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(r["error"] is None for r in records)
    for record in records:  # echo calls search_pages with the question, then repeats the result
        tool = next(m for m in record["completion"] if m["role"] == "tool")
        assert " | " in tool["content"] and record["state"]["tool_calls"] == 1 and record["reward"] == 0.0


async def test_env_group_of_wordle_and_wiki_search_through_the_engine():
    group = EnvGroup([load_environment("wordle"), load_environment("wiki-search")])
    examples = group.get_examples(4)
    assert [e.task for e in examples] == ["wordle", "wiki-search"] * 2
    groups = []
    stats = await run_rollouts(
        group,
        EchoClient(),
        examples,
        rollouts_per_example=2,
        sampling=SamplingParams(),
        on_group=groups.append,
    )
    assert stats.groups == 4 and stats.errors == 0
    by_task = {g.rollouts[0].task: g.rollouts[0] for g in groups}
    assert by_task["wordle"].num_turns == 6 and "win_reward" in by_task["wordle"].rewards
    assert (
        by_task["wiki-search"].completion[1]["role"] == "tool"
        and "exact_match_reward" in by_task["wiki-search"].rewards
    )
