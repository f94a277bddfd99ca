"""wordle: feedback rules, seeded disjoint splits, rewards on hand-written games, the turn loop
(malformed and unknown guesses use a turn, a win ends early, 6 turns at most), and an eval
through the real CLI against the echo server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.servers import EchoBackend, make_app, serve_in_thread
from tests.test_cli_errors import workbench
from workbench.envs import load_environment
from workbench.envs.environment import RolloutOutput
from workbench.envs.loader import find_environment, import_env_module
from workbench.types import Completion, SamplingParams

wordle = import_env_module(find_environment("wordle"))


class ScriptedClient:
    """Replays fixed assistant texts, one per call."""

    model = "scripted"

    def __init__(self, texts: list[str]) -> None:
        self.texts = list(texts)

    async def chat(self, messages, *, sampling, tools=None):
        return [Completion(message={"role": "assistant", "content": self.texts.pop(0)}, finish_reason="stop")]

    async def close(self) -> None:
        pass


def game(*turns: str) -> list[dict]:
    """A transcript: assistant guesses with (irrelevant) user replies in between."""
    messages: list[dict] = []
    for text in turns:
        if messages:
            messages.append({"role": "user", "content": "feedback"})
        messages.append({"role": "assistant", "content": text})
    return messages


@pytest.mark.parametrize(
    ("guess", "secret", "pattern"),
    [
        ("crane", "crane", "GGGGG"),
        ("speed", "abide", "--Y-Y"),  # one 'e' in the secret: only the first 'e' is yellow
        ("geese", "eerie", "-GY-G"),  # greens are taken first, then one yellow for the spare 'e'
        ("llama", "hello", "YY---"),
        ("eerie", "geese", "YG--G"),
    ],
)
def test_score_guess_follows_wordle_rules_for_repeated_letters(guess, secret, pattern):
    assert wordle.score_guess(guess, secret) == pattern


def test_parse_guess_and_format():
    assert wordle.parse_guess("I think <guess> Crane </guess>") == "crane"
    assert wordle.parse_guess("<guess>[slate]</guess>") == "slate"
    assert wordle.parse_guess("<guess>cranes</guess>") is None
    assert wordle.parse_guess("crane") is None
    assert wordle.is_well_formed("<guess>crane</guess>")
    assert not wordle.is_well_formed("<guess>crane</guess><guess>slate</guess>")


def test_splits_are_seeded_disjoint_common_words():
    env, again, other = (
        load_environment("wordle"),
        load_environment("wordle"),
        load_environment("wordle", seed=1),
    )
    train = [e.answer for e in env.get_examples(-1, split="train")]
    evals = [e.answer for e in env.get_examples(-1, split="eval")]
    assert len(evals) == 200 and len(train) == 1000
    assert not set(train) & set(evals)
    assert evals == [e.answer for e in again.get_examples(-1)]
    assert evals != [e.answer for e in other.get_examples(-1)]
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in train + evals)
    assert not set(train + evals) & wordle.NOT_ANSWERS
    assert {"about", "house", "water"} <= set(wordle.answer_pool(20_000))


async def test_hand_written_games_score_as_expected():
    env = load_environment("wordle")
    example = env.get_examples(1)[0]
    secret = example.answer
    wrong = next(w for w in ("pious", "lymph", "crane") if w != secret)
    cases = {
        "first-turn win": game(f"<guess>{secret}</guess>"),
        "third-turn win": game(
            "<guess>zzzzz</guess>", f"<guess>{wrong}</guess>", f"<guess>{secret.upper()}</guess>"
        ),
        "lost": game(*[f"<guess>{wrong}</guess>"] * 6),
        "malformed": game("I have no idea", "<guess>toolong</guess>", ""),
        "empty": [],
    }
    scores = dict(
        zip(
            cases, await env.score_group(example, [RolloutOutput(c, {}) for c in cases.values()]), strict=True
        )
    )
    assert scores["first-turn win"].reward == pytest.approx(1.0)
    third = scores["third-turn win"]
    assert third.rewards["win_reward"] == 1.0 and third.rewards["fewer_turns_reward"] == pytest.approx(4 / 6)
    assert 0.8 < third.reward < 1.0
    assert scores["lost"].rewards["win_reward"] == 0.0 and scores["lost"].reward < 0.6
    assert scores["malformed"].reward == 0.0 and scores["empty"].reward == 0.0
    assert all(s.error is None for s in scores.values())


async def test_turn_loop_messages_and_early_win():
    env = load_environment("wordle")
    example = env.get_examples(1)[0]
    secret = example.answer
    wrong = next(w for w in ("pious", "lymph") if w != secret)
    client = ScriptedClient(
        ["hmm", "<guess>qzxvj</guess>", f"<guess>{wrong}</guess>", f"<guess>{secret}</guess>", "unused"]
    )
    out = await env.rollout(client, example, SamplingParams())
    assert out.error is None and out.num_turns == 4 and out.stop_condition == "completed"
    replies = [m["content"] for m in out.completion if m["role"] == "user"]
    assert "No guess found" in replies[0] and "5 guesses left" in replies[0]
    assert "'qzxvj' is not in the word list" in replies[1] and "4 guesses left" in replies[1]
    pattern = wordle.score_guess(wrong, secret)
    assert (
        replies[2].startswith(wrong.upper())
        and " ".join(pattern) in replies[2]
        and "3 guesses left" in replies[2]
    )
    assert out.state["won"] is True
    assert [g["guess"] for g in out.state["guesses"]] == [None, "qzxvj", wrong, secret]
    scores = await env.score_group(example, [out])
    assert scores[0].rewards["win_reward"] == 1.0 and scores[0].rewards[
        "fewer_turns_reward"
    ] == pytest.approx(3 / 6)


async def test_at_most_max_turns():
    env = load_environment("wordle", max_turns=6)
    example = env.get_examples(1)[0]
    out = await env.rollout(ScriptedClient(["<guess>zzzzz</guess>"] * 10), example, SamplingParams())
    assert out.num_turns == 6 and out.stop_condition == "max_turns" and out.state["won"] is False
    assert "1 guess left" in out.completion[-2]["content"]


async def test_reference_solver_plays_a_consistent_game():
    env = load_environment("wordle")
    wins = 0
    for example in env.get_examples(5):
        reference = env.reference_completion(example)
        guesses = [m["content"] for m in reference if m["role"] == "assistant"]
        client = ScriptedClient(guesses)
        out = await env.rollout(client, example, SamplingParams())
        assert [m["content"] for m in out.completion] == [m["content"] for m in reference]  # same feedback
        wins += out.state["won"]
    assert wins >= 3


def test_owner_prefix_resolves():
    assert load_environment("primeintellect/wordle").env_id == "wordle"


def test_eval_cli_end_to_end_against_echo_server(tmp_path: Path):
    with serve_in_thread(make_app(EchoBackend())) as url:
        result = workbench(
            "eval",
            "run",
            "wordle",
            "-m",
            "echo",
            "-b",
            f"{url}/v1",
            "-n",
            "4",
            "-r",
            "2",
            "-C",
            "guesses,won",
            cwd=tmp_path,
        )
    assert result.returncode == 0, result.stderr
    run_dir = next((tmp_path / "environments" / "wordle" / "outputs" / "evals" / "wordle--echo").iterdir())
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(r["error"] is None for r in records)
    assert all(
        r["num_turns"] == 6 and r["stop_condition"] == "max_turns" for r in records
    )  # echo never guesses
    assert all(r["reward"] == 0.0 and len(r["state"]["guesses"]) == 6 for r in records)
    assert "win_reward" in result.stdout
