"""LoRA adapters loaded at runtime onto one in-process model (what `workbench serve
--enable-lora` does for `/v1/load_lora_adapter`).

Design: the base model is wrapped once in a peft `PeftModel`; every adapter is a named peft
adapter on it, and a batch runs with exactly one adapter active (or none, for the base).
So memory grows by the adapter size only, never by a model copy, as in vLLM's multi-LoRA.

Public names (what requests put in `model`) map to internal *versions*: loading a new
adapter under an existing name (vLLM's `load_inplace`) adds a new version and repoints
the name, it never rewrites the weights a queued request was accepted with. A version
that nothing points at any more is deleted once no accepted request still uses it.
A failed load removes whatever it had added, so earlier adapters keep working.

Locking: `load`, `unload`, `reap` and `activate` change the model, so the caller holds the
lock that keeps generation off it (`LocalClient.exclusive_weights` / its batch lock);
`acquire`/`release` only count requests and may be called from any thread.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from workbench.errors import InferenceError

# vLLM's accepted --max-lora-rank values (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_MAX_LORA_RANK = 16  # vLLM's default


class AdapterError(InferenceError):
    """An adapter could not be loaded or used; `status` is the HTTP status vLLM would send
    (404: no adapter at that path / no adapter of that name, 400: anything else)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message, transient=False, status=status)


def read_adapter_config(path: Path, name: str, max_rank: int | None) -> dict[str, Any]:
    """The adapter's `adapter_config.json`, checked before any weight is touched."""
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        # vLLM's wording; its server turns "No adapter found" into a 404.
        raise AdapterError(f"Loading lora {name} failed: No adapter found for {path}", status=404)
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"Loading lora {name} failed: {config_file} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"Loading lora {name} failed: {config_file} is not a LoRA adapter config")
    ranks = [config.get("r", 8), *(config.get("rank_pattern") or {}).values()]
    rank = max(r for r in ranks if isinstance(r, int))
    if max_rank is not None and rank > max_rank:
        raise AdapterError(f"LoRA rank {rank} is greater than max_lora_rank {max_rank}.")
    return config


class AdapterSet:
    """Named LoRA adapters on one model; see the module docstring."""

    def __init__(self, model: Any) -> None:
        if hasattr(model, "peft_config"):
            # The trainer's own PeftModel: its adapter is being trained, not served by name.
            raise AdapterError(
                "this model already carries peft adapters; runtime LoRA loading needs a plain base model"
            )
        self._model = model  # the plain HF model that generation calls; peft injects into it
        self._peft: Any = None  # the PeftModel wrapper, created on the first load
        self._current: dict[str, str] = {}  # public name -> internal version
        self._paths: dict[str, str] = {}  # public name -> folder it was loaded from
        self._users: Counter[str] = Counter()  # internal version -> accepted, unfinished requests
        self._retired: set[str] = set()  # versions no name points at, deleted once unused
        self._versions = 0
        self._book = threading.Lock()  # guards the four bookkeeping fields above

    @property
    def names(self) -> dict[str, str]:
        """Loaded adapters: public name -> folder."""
        with self._book:
            return dict(self._paths)

    def load(self, name: str, path: str | Path, *, max_rank: int | None = None) -> None:
        """Load the adapter folder `path` as `name` (replacing an adapter of that name)."""
        folder = Path(path).expanduser()
        read_adapter_config(folder, name, max_rank)
        with self._book:
            self._versions += 1
            version = f"wb_lora_{self._versions}"  # peft names become module keys: no dots
        try:
            self._add_version(version, folder)
        except AdapterError:
            self._drop_version(version)
            raise
        except Exception as exc:
            self._drop_version(version)
            raise AdapterError(f"Loading lora {name} failed: {_describe(exc)}") from exc
        with self._book:
            old = self._current.get(name)
            self._current[name] = version
            self._paths[name] = str(folder)
            if old is not None:
                self._retired.add(old)
        self.reap()

    def unload(self, name: str) -> None:
        """Forget `name`; requests already accepted for it still finish on its weights."""
        with self._book:
            if name not in self._current:
                raise AdapterError(f"The lora adapter '{name}' cannot be found.", status=404)
            self._retired.add(self._current.pop(name))
            del self._paths[name]
        self.reap()

    def acquire(self, name: str) -> str:
        """Pin the current version of `name` for one accepted request; returns the version."""
        with self._book:
            version = self._current.get(name)
            if version is None:
                raise AdapterError(f"The model `{name}` does not exist.", status=404)
            self._users[version] += 1
            return version

    def release(self, version: str) -> None:
        """One request pinned to `version` is done (delivered, failed or cancelled)."""
        with self._book:
            self._users[version] -= 1
            if self._users[version] <= 0:
                del self._users[version]

    def activate(self, version: str | None) -> None:
        """Make the next forward passes use `version` (None: the base model alone)."""
        if self._peft is None:
            if version is not None:
                raise AdapterError(f"adapter version {version} is not loaded", status=404)
            return
        if version is None:
            self._peft.base_model.disable_adapter_layers()
            return
        if version not in self._peft.peft_config:
            raise AdapterError(f"adapter version {version} is not loaded", status=404)
        self._peft.base_model.enable_adapter_layers()
        self._peft.set_adapter(version)

    def reap(self) -> None:
        """Delete retired versions that no accepted request uses any more."""
        with self._book:
            unused = [v for v in self._retired if self._users[v] <= 0]
            self._retired.difference_update(unused)
        for version in unused:
            self._drop_version(version)

    def _add_version(self, version: str, folder: Path) -> None:
        from peft import PeftConfig, PeftModel

        device = next(self._model.parameters()).device
        if self._peft is None:
            config = PeftConfig.from_pretrained(str(folder))
            config.inference_mode = True
            # Injects empty LoRA layers for `version`; its weights are loaded just below.
            self._peft = PeftModel(self._model, config, adapter_name=version)
        self._peft.load_adapter(str(folder), adapter_name=version, torch_device=str(device))
        self._peft.base_model.disable_adapter_layers()  # nothing active until a batch asks

    def _drop_version(self, version: str) -> None:
        if self._peft is not None and version in self._peft.peft_config:
            self._peft.delete_adapter(version)
            # peft re-activates some remaining adapter after a delete; batches choose their own.
            self._peft.base_model.disable_adapter_layers()


def _describe(exc: Exception) -> str:
    """One line for a peft/torch load failure (torch lists every mismatched tensor: keep one)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[:2]) if lines else ""
    if "size mismatch" in text:
        text += " (an adapter trained on a different base model?)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
