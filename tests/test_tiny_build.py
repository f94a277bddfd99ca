"""Building the tiny model: loads like any HF model, seeded, fingerprinted, written atomically."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from workbench.models.synthetic import reverse_text_demonstrations
from workbench.models.tiny import (
    BUILD_INFO_FILE,
    TinyModelSpec,
    build_fingerprint,
    build_tiny_model,
    demonstrations_digest,
    is_current_build,
)

# Small and short: these tests check the builder's contract, not the model's quality.
SPEC = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, steps=20, batch_size=8)
DEMOS = reverse_text_demonstrations(64, seed=1)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[int, int, float]]]:
    calls: list[tuple[int, int, float]] = []
    out = tmp_path_factory.mktemp("build") / "tiny"
    build_tiny_model(out, DEMOS, SPEC, progress=lambda step, total, loss: calls.append((step, total, loss)))
    return out, calls


def test_build_loads_with_auto_classes(built) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = built
    model = AutoModelForCausalLM.from_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    assert model.config.model_type == "llama"
    assert model.config.tie_word_embeddings is True
    assert model.config.vocab_size == len(tok)
    text = "tabs\tand spaces  é 日本 🙂\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.chat_template and "<tools>" in tok.chat_template
    assert tok.eos_token_id in model.generation_config.eos_token_id


def test_progress_reported_and_loss_falls(built) -> None:
    _, calls = built
    assert [c[0] for c in calls] == list(range(1, SPEC.steps + 1))
    assert all(total == SPEC.steps for _, total, _ in calls)
    first, last = calls[0][2], calls[-1][2]
    assert last < first * 0.8  # the model learned something


def test_fingerprint_and_current_build(built, tmp_path: Path) -> None:
    out, _ = built
    fingerprint = build_fingerprint(SPEC)  # computable before building
    assert is_current_build(out, fingerprint)
    info = json.loads((out / BUILD_INFO_FILE).read_text())
    assert info["spec"]["steps"] == SPEC.steps and info["build_seconds"] > 0
    assert info["demonstrations_sha256"] == demonstrations_digest(DEMOS) != demonstrations_digest(DEMOS[:10])
    assert build_fingerprint(TinyModelSpec(seed=1)) != build_fingerprint(TinyModelSpec(seed=0))
    assert build_fingerprint(SPEC, extra="envs-v2") != fingerprint
    assert not is_current_build(out, build_fingerprint(dataclasses.replace(SPEC, steps=21)))
    assert not is_current_build(tmp_path / "missing", fingerprint)
    # A caller-chosen fingerprint is what gets recorded.
    custom = build_tiny_model(tmp_path / "custom", DEMOS[:8], SPEC, steps=1, fingerprint="abc")
    assert is_current_build(custom, "abc") and not is_current_build(custom, fingerprint)
    # No temp/old folders left next to the build.
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]
    # The effective spec (after keyword overrides) is what the recorded fingerprint covers.
    overridden = build_tiny_model(tmp_path / "over", DEMOS[:8], SPEC, steps=1)
    assert is_current_build(overridden, build_fingerprint(dataclasses.replace(SPEC, steps=1)))


@pytest.mark.extended  # two more builds (~20 s); the fingerprint test above covers what a rebuild keys on
def test_same_seed_same_weights_and_overrides(built, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    out, _ = built
    again = build_tiny_model(tmp_path / "again", DEMOS, SPEC)
    a, b = load_file(str(out / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a)
    other = build_tiny_model(tmp_path / "other", DEMOS, SPEC, seed=1, steps=2)
    info = json.loads((other / BUILD_INFO_FILE).read_text())
    assert info["spec"]["seed"] == 1 and info["spec"]["steps"] == 2
    c = load_file(str(other / "model.safetensors"))
    assert any(not (a[k] == c[k]).all() for k in a)


def test_rebuild_replaces_existing_folder(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    build_tiny_model(out, DEMOS[:8], SPEC, steps=1)
    assert not (out / "stale.txt").exists()
    assert (out / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]
