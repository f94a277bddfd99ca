"""Server mode's client: base URLs and endpoint ids (their replicas, with their keys) become one
round-robin pool of token-returning clients; a mistake is one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.errors import UserError
from workbench.train.publish import server_client
from workbench.train.schema import TrainConfig

REGISTRY = """
[[endpoint]]
endpoint_id = "pool"
model = "tiny"
url = "http://127.0.0.1:8001/v1"
key = "POOL_KEY"

[[endpoint]]
endpoint_id = "pool"
model = "tiny"
url = "http://127.0.0.1:8002/v1"
key = "POOL_KEY"
"""


def config(*refs: str) -> TrainConfig:
    return TrainConfig.model_validate(
        {"env": [{"id": "reverse-text"}], "inference": {"mode": "server", "base_urls": list(refs)}}
    )


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "endpoints.toml").write_text(REGISTRY)
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(tmp_path))
    return tmp_path


def test_urls_and_endpoint_replicas_make_one_pool(registry: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("POOL_KEY", "sk-pool")
    client = server_client(config("http://127.0.0.1:9000/v1", "pool"))
    assert [c.base_url for c in client.clients] == [
        "http://127.0.0.1:9000/v1",
        "http://127.0.0.1:8001/v1",
        "http://127.0.0.1:8002/v1",
    ]
    assert all(c.return_tokens for c in client.clients)
    assert [c.api_key for c in client.clients] == [None, "sk-pool", "sk-pool"]


def test_unknown_endpoint_and_missing_key_are_one_line(registry: Path, monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(UserError, match="'nope' is neither a URL nor an endpoint id"):
        server_client(config("nope"))
    monkeypatch.delenv("POOL_KEY", raising=False)
    with pytest.raises(UserError, match="POOL_KEY"):
        server_client(config("pool"))
