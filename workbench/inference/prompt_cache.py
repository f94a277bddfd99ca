"""Rendered prompts, kept by content: a group's rollouts render one prompt once.

The engine runs each of a group's rollouts as its own chat call (an eval's `-r 8`, an RL step's
8 samples of a prompt), and `LocalClient` renders every call's messages through the chat
template and the tokenizer: 0.2-0.3 ms per call on the event loop, serially, before a batch can
start (16 ms of a 64-request batch's 240 ms on the tiny model). The same messages and tools
always render to the same ids, so `RenderedPrompts` keeps the last `CAPACITY` of them.

Not kept: prompts of a template that reads the clock (`strftime_now`, as Llama 3's templates
do for today's date), and messages that are not plain JSON data (their text could not be
compared reliably).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

CAPACITY = 4096  # distinct prompts: an eval's or an RL step's examples, each with its whole group


class RenderedPrompts:
    """Prompt ids by (messages, tools), least recently used first out; thread-safe."""

    def __init__(self, tokenizer: Any, capacity: int = CAPACITY) -> None:
        self.enabled = _fixed_template(tokenizer)
        self.capacity = capacity
        self._ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def key(self, messages: Any, tools: Any) -> str | None:
        """The cache key of a render, or None when it is not cached."""
        if not self.enabled:
            return None
        try:
            return json.dumps([messages, tools], separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):  # not plain JSON data
            return None

    def get(self, key: str | None) -> list[int] | None:
        if key is None:
            return None
        with self._lock:
            ids = self._ids.get(key)
            if ids is None:
                return None
            self._ids.move_to_end(key)
        return list(ids)

    def put(self, key: str | None, ids: list[int]) -> None:
        if key is None:
            return
        with self._lock:
            self._ids[key] = tuple(ids)
            self._ids.move_to_end(key)
            while len(self._ids) > self.capacity:
                self._ids.popitem(last=False)


def _fixed_template(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders the same messages the same way every time."""
    template = getattr(tokenizer, "chat_template", None)
    sources = template.values() if isinstance(template, dict) else [template]
    return not any("strftime_now" in source for source in sources if isinstance(source, str))
