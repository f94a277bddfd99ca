"""transformers' KV-cache keyword (a forward argument and an output field) under the installed
version's name.

transformers 5.x renamed `past_key_values` to `cache`; the old name still works, with a notice,
until 5.40 removes it. Workbench supports transformers >= 4.46, which knows only the old name,
so the name is read once from the installed library (its causal-LM output's fields).
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _field() -> str:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_argument(kv_cache: Any) -> dict[str, Any]:
    """`model(**cache_argument(c), ...)`: the KV cache passed under the installed name."""
    return {_field(): kv_cache}


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned (`output.cache`, or `output.past_key_values` before 5.x)."""
    return getattr(output, _field())
