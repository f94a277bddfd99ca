"""A distillation teacher behind a server: `workbench serve`'s `/v1/completions` scores token ids
(vLLM's echo + logprobs), the same numbers the teacher gives in-process, and a distill run uses it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from tests.servers import make_app, serve_in_thread
from workbench.inference.local_client import LocalClient
from workbench.inference.openai_client import OpenAIClient
from workbench.train.samples import Sample
from workbench.train.schema import DistillConfig
from workbench.train.teacher import ModelTeacher


@pytest.fixture
def served_tiny(tiny_model: Path):
    client = LocalClient(tiny_model, model_name="teacher")
    with serve_in_thread(make_app(client)) as url:
        yield f"{url}/v1"
    asyncio.run(client.close())


def test_served_scores_match_the_in_process_teacher(served_tiny: str, tiny_model: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    ids = tokenizer("Reverse the text: green apple")["input_ids"]
    client = OpenAIClient(served_tiny, "teacher")

    async def over_http() -> list[float]:
        try:
            return await client.prompt_logprobs(ids)
        finally:
            await client.close()

    served = asyncio.run(over_http())
    local = ModelTeacher.load(DistillConfig(teacher_model=str(tiny_model)), tokenizer)
    sample = Sample(list(ids), [0] + [1] * (len(ids) - 1), [0.0] * len(ids), 0.0)
    [in_process] = asyncio.run(local.logprobs([sample], temperature=1.0))
    assert len(served) == len(ids) and served[0] == 0.0
    assert served == pytest.approx(in_process, abs=1e-4)


def test_scoring_requests_that_cannot_be_served_are_400(served_tiny: str):
    async def post(body: dict) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{served_tiny}/completions", json=body) as r,
        ):
            return r.status, await r.text()

    status, text = asyncio.run(post({"prompt": [1, 2, 3], "echo": True}))
    assert status == 400 and "needs 'logprobs'" in text  # scoring without logprobs
    status, text = asyncio.run(post({"prompt": "text", "echo": True, "logprobs": 0}))
    assert status == 400 and "token ids" in text


def test_a_distill_run_with_a_served_teacher(served_tiny: str, tiny_workspace: Path):
    from workbench.train import load_train_config, run_train

    path = tiny_workspace / "d.toml"
    path.write_text(f"""
model = "tiny"
mode = "distill"
max_steps = 1
batch_size = 4
rollouts_per_example = 1
micro_batch_size = 4
[distill]
teacher_model = "teacher"
teacher_base_url = "{served_tiny}"
[sampling]
max_tokens = 24
[[env]]
id = "reverse-text"
[wandb]
mode = "disabled"
""")
    config, _ = load_train_config(path)
    result = run_train(config)
    [step] = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert abs(step["distill/reverse_kl"]) < 0.01  # the teacher is the student's own base model
