"""Hugging Face hub ids (`-m Qwen/Qwen3-0.6B`): load from the local cache, or the hub when it
answers; otherwise one line that says so and how to use a local folder instead.

Without this check, an unreachable hub costs about a minute of huggingface_hub's own retries
(printed to the terminal) before transformers gives up with a message that does not say what
to do. The probe is one HEAD request with a short timeout, made only when the model is not in
the cache; `HF_HUB_OFFLINE=1` skips it and uses the cache alone, as huggingface_hub does.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request

from workbench.errors import UserError

PROBE_TIMEOUT_S = 5.0  # a reachable hub answers a HEAD in well under a second
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # owner/name (a local path that looks like one is checked first)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE is set: use the local cache alone, as huggingface_hub does."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def is_cached(model_id: str) -> bool:
    """Whether the model's config is in the local hub cache (then it loads offline)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model_id, "config.json")
    return isinstance(found, str)


def hub_reachable(timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """One HEAD request to the hub's API; any HTTP answer (even an error status) means it is up."""
    request = urllib.request.Request(f"{hub_endpoint()}/api/models", method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


def require_hub_model(model_id: str) -> None:
    """Return when `model_id` can be loaded (the hub answers, or it is cached); UserError
    otherwise. With the hub unreachable but the model cached, later loads stay offline."""
    offline = hub_offline()
    if not offline and hub_reachable():
        return
    if not offline:
        go_offline()
    if is_cached(model_id):
        return
    why = "HF_HUB_OFFLINE is set" if offline else f"the Hugging Face hub ({hub_endpoint()}) is unreachable"
    raise UserError(
        f"cannot load '{model_id}': {why} and it is not in the local cache; download it where "
        f"the hub is reachable (`hf download {model_id} --local-dir DIR`) and pass -m DIR, "
        "or use an embedded model (-m tiny, -m tiny-qwen)"
    )


def go_offline() -> None:
    """Make huggingface_hub (and transformers and datasets through it) use the cache without
    trying the network: the environment variable for what imports them later, and their module
    constants if already imported. Neither library has a public setter once imported (the variable
    is read at import), so this is the one place that sets their constants;
    tests/test_hub_offline_internals.py fails loudly if either library renames them."""
    import sys

    os.environ["HF_HUB_OFFLINE"] = "1"
    if "huggingface_hub.constants" in sys.modules:  # already imported: no import paid here
        from huggingface_hub import constants

        constants.HF_HUB_OFFLINE = True  # read at call time by its download functions
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        setattr(datasets_config, "HF_HUB_OFFLINE", True)  # noqa: B010  (read at call time, like huggingface_hub's)
