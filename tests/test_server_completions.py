"""`/v1/completions` on `workbench serve` as real clients use it (issue 34.5): text generation from
a string or token-id prompt, legacy logprobs with token text, several prompts, and `stream: true`
with usage last - read by the official `openai` SDK from the tiny model served by `LocalClient`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import make_app, serve_in_thread
from workbench.inference.local_client import LocalClient


@pytest.fixture(scope="module")
def served(tiny_model: Path) -> Iterator[tuple[str, LocalClient]]:
    backend = LocalClient(str(tiny_model), model_name="tiny")
    with serve_in_thread(make_app(backend)) as base:
        yield f"{base}/v1", backend
    asyncio.run(backend.close())


def test_a_text_prompt_is_completed_as_in_process(served: tuple[str, LocalClient]) -> None:
    from openai import OpenAI

    from workbench.types import SamplingParams

    url, backend = served
    client = OpenAI(base_url=url, api_key="unused")
    answer = client.completions.create(
        model="tiny", prompt="Reverse: stone", max_tokens=12, temperature=0, logprobs=2
    )
    (choice,) = answer.choices
    ids = backend.encode_text("Reverse: stone")
    (expected,) = asyncio.run(
        backend.complete_ids(ids, sampling=SamplingParams(temperature=0, max_tokens=12))
    )
    assert choice.text == expected.message["content"]
    assert answer.usage is not None and answer.usage.prompt_tokens == len(ids)
    assert expected.tokens is not None and answer.usage.completion_tokens == len(
        expected.tokens.completion_ids
    )
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs and logprobs.top_logprobs
    assert not any(t.startswith("token_id:") for t in logprobs.tokens)  # token text unless asked for ids
    assert logprobs.token_logprobs == pytest.approx(expected.tokens.completion_logprobs, abs=1e-5)
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)  # dict keys are token texts: may collide
    assert logprobs.text_offset is not None and logprobs.text_offset[0] == 0
    assert choice.finish_reason in ("stop", "length")


def test_token_id_prompts_and_several_prompts_number_their_choices(served: tuple[str, LocalClient]) -> None:
    from openai import OpenAI

    url, backend = served
    client = OpenAI(base_url=url, api_key="unused")
    ids = backend.encode_text("Reverse: tree")
    answer = client.completions.create(
        model="tiny", prompt=[ids, ids], n=2, max_tokens=4, temperature=1.0, seed=3,
        extra_body={"return_tokens_as_token_ids": True}, logprobs=0,
    )  # fmt: skip
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]  # prompt index * n + i, as vLLM
    assert all(
        t.startswith("token_id:") for c in answer.choices for t in (c.logprobs.tokens if c.logprobs else [])
    )


def test_streaming_completions_end_with_usage_and_done(served: tuple[str, LocalClient]) -> None:
    from openai import OpenAI

    url, _ = served
    client = OpenAI(base_url=url, api_key="unused")
    plain = client.completions.create(model="tiny", prompt="Reverse: cat", max_tokens=10, temperature=0)
    chunks = list(
        client.completions.create(
            model="tiny", prompt="Reverse: cat", max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage


def test_bad_completion_requests_get_one_line(served: tuple[str, LocalClient]) -> None:
    from openai import BadRequestError, NotFoundError, OpenAI

    url, _ = served
    client = OpenAI(base_url=url, api_key="unused", max_retries=0)
    with pytest.raises(BadRequestError, match="'prompt' must be"):
        client.completions.create(model="tiny", prompt="", max_tokens=2)
    with pytest.raises(BadRequestError, match="'logprobs' must be"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=99)
    with pytest.raises(NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
