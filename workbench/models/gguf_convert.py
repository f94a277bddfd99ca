"""A GGUF file (llama.cpp's format) as a plain Hugging Face model folder.

transformers reads GGUF itself (`from_pretrained(folder, gguf_file=...)`, with the `gguf`
package) and dequantizes every tensor to float32, but a model loaded that way refuses
`save_pretrained` ("quantized with gguf and is not serializable"). So the weights are copied
into a fresh model built from the same config, without its quantization entry, and that one
is saved: the folder then loads like any other, with no `gguf` package and no conversion at
each start (17 s for SmolLM2-135M on 2 cores, once).

Every way a file can be wrong (not a GGUF, cut short, an architecture transformers cannot
build) is one `UserError` line naming the file, checked before the slow load.
"""

from __future__ import annotations

from pathlib import Path

from workbench.errors import UserError

GGUF_EXTRA = "pip install 'workbench[gguf]'  (or: pip install gguf)"


def require_gguf_package() -> None:
    """UserError with the install command when the optional `gguf` package is missing."""
    try:
        import gguf  # noqa: F401  (only its presence is checked here)
    except ImportError:
        raise UserError(f"reading a GGUF file needs the `gguf` package: {GGUF_EXTRA}") from None


def gguf_architecture(path: Path) -> str:
    """The file's `general.architecture`, after checking that the whole file reads as GGUF
    (header, metadata and every tensor's extent): UserError otherwise."""
    require_gguf_package()
    from gguf import GGUFReader

    if not path.is_file():
        raise UserError(f"GGUF file not found: {path}")
    try:
        reader = GGUFReader(path)
        field = reader.fields.get("general.architecture")
        architecture = field.contents() if field is not None else None
    except (ValueError, LookupError, OSError) as exc:  # bad magic, cut short, empty: numpy says which
        raise UserError(f"{path} is not a readable GGUF file (corrupt or truncated: {exc})") from None
    if not isinstance(architecture, str) or not architecture:
        raise UserError(f"{path} names no general.architecture, so its model cannot be built")
    return architecture


def supported_architectures() -> list[str]:
    """The GGUF architectures this transformers can build a model for."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return list(GGUF_SUPPORTED_ARCHITECTURES)


def check_gguf(path: Path) -> None:
    """UserError unless `path` is a whole GGUF file of an architecture transformers can build."""
    architecture = gguf_architecture(path)
    if architecture not in supported_architectures():
        raise UserError(
            f"{path} holds a '{architecture}' model, which transformers cannot build from GGUF "
            f"(it can: {', '.join(sorted(supported_architectures()))})"
        )


def convert_gguf(path: Path, out: Path) -> None:
    """Write `path` (a GGUF file) into the folder `out` as a Hugging Face model: float32
    safetensors, config, tokenizer with its chat template, generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf(path)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, LookupError, OSError, TypeError) as exc:
        raise UserError(f"could not build a model from {path}: {str(exc).splitlines()[0]}") from None
    config = loaded.config
    del config.quantization_config  # what makes save_pretrained refuse; the weights are plain float32 now
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
