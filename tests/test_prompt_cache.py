"""A group's rollouts render their prompt once (workbench/inference/prompt_cache.py): the same
messages and tools give the cached ids, anything else renders anew, and a template that reads
the clock is never cached."""

from __future__ import annotations

from pathlib import Path

from workbench.inference.prompt_cache import RenderedPrompts


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Reverse the text."}, {"role": "user", "content": text}]


def test_the_same_prompt_renders_once_and_others_render_anew(tiny_model: Path):
    from transformers import AutoTokenizer

    from workbench.inference.local_client import LocalClient

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    client = LocalClient(tiny_model, model_name="tiny")
    calls = []
    render = tokenizer.apply_chat_template
    client._tokenizer.apply_chat_template = lambda *a, **k: calls.append(a) or render(*a, **k)
    first = client.render_prompt_ids(messages("abc"))
    again = client.render_prompt_ids(messages("abc"))
    other = client.render_prompt_ids(messages("abd"))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with_tools = client.render_prompt_ids(messages("abc"), [tool])
    assert first == again and first is not again  # a copy: callers may change theirs
    assert other != first and len(calls) == 3  # "abc", "abd", and "abc" with a tool
    expected = tokenizer.encode(
        render(messages("abc"), tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    assert first == expected and with_tools != first


def test_least_recently_used_prompts_leave_first():
    cache = RenderedPrompts(tokenizer=None, capacity=2)
    a, b, c = (cache.key(messages(t), None) for t in "abc")
    cache.put(a, [1])
    cache.put(b, [2])
    assert cache.get(a) == [1]  # a is now the most recent
    cache.put(c, [3])
    assert cache.get(b) is None and cache.get(a) == [1] and cache.get(c) == [3]


def test_a_template_that_reads_the_clock_or_odd_messages_are_never_cached():
    class Dated:
        chat_template = "{{ strftime_now('%d %b %Y') }}{% for m in messages %}{{ m.content }}{% endfor %}"

    assert RenderedPrompts(Dated()).key(messages("a"), None) is None
    assert RenderedPrompts(tokenizer=None).key([{"role": "user", "content": object()}], None) is None
