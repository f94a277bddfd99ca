"""`models.hub.go_offline` sets huggingface_hub's (and datasets') module constant HF_HUB_OFFLINE:
the variable is read once at import and neither library has a public setter. This fails loudly
when a library renames or drops the constant, instead of the offline switch silently doing nothing."""

from __future__ import annotations

import importlib.util
import os

import pytest

from workbench.models.hub import go_offline


def test_huggingface_hub_still_reads_its_offline_constant(monkeypatch: pytest.MonkeyPatch):
    from huggingface_hub import constants

    assert isinstance(constants.HF_HUB_OFFLINE, bool)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    go_offline()
    assert constants.HF_HUB_OFFLINE is True and os.environ["HF_HUB_OFFLINE"] == "1"


@pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="datasets is optional")
def test_datasets_still_reads_its_offline_constant(monkeypatch: pytest.MonkeyPatch):
    import datasets.config

    assert isinstance(datasets.config.HF_HUB_OFFLINE, bool)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    go_offline()
    assert datasets.config.HF_HUB_OFFLINE is True
