"""configs/endpoints.toml: parsing, replicas, one-line errors, keys from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.servers import EchoBackend, HeaderRecorder, make_app, serve_in_thread
from workbench.errors import UserError
from workbench.inference.endpoints import (
    Endpoint,
    api_key_from_env,
    client_for_endpoint,
    load_endpoints,
    resolve_endpoint,
)
from workbench.inference.openai_client import OpenAIClient, RoundRobinClient
from workbench.types import SamplingParams

REGISTRY = """\
# Endpoints for -m NAME
[[endpoint]]
endpoint_id = "gpt-4.1-mini"
model = "gpt-4.1-mini"
url = "https://api.openai.com/v1"
key = "OPENAI_API_KEY"

[[endpoint]]
endpoint_id = "qwen"
model = "Qwen/Qwen3-4B"
url = "http://node1:8000/v1"

[[endpoint]]
endpoint_id = "qwen"
model = "Qwen/Qwen3-4B"
url = "http://node2:8000/v1"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "configs" / "endpoints.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def error_of(path: Path) -> str:
    with pytest.raises(UserError) as info:
        load_endpoints(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_parses_entries_and_replicas(tmp_path: Path) -> None:
    registry = load_endpoints(write(tmp_path, REGISTRY))
    assert list(registry) == ["gpt-4.1-mini", "qwen"]
    [gpt] = registry["gpt-4.1-mini"]
    assert (gpt.model, gpt.url, gpt.key) == ("gpt-4.1-mini", "https://api.openai.com/v1", "OPENAI_API_KEY")
    assert [e.url for e in registry["qwen"]] == ["http://node1:8000/v1", "http://node2:8000/v1"]
    assert registry["qwen"][0].key is None


def test_missing_file_is_empty(tmp_path: Path) -> None:
    assert load_endpoints(tmp_path / "nope.toml") == {}


def test_unknown_key_names_file_line_and_suggestion(tmp_path: Path) -> None:
    text = REGISTRY.replace('url = "http://node1:8000/v1"', 'urll = "http://node1:8000/v1"')
    path = write(tmp_path, text)
    assert error_of(path) == f"{path}:11: unknown key 'urll' in [[endpoint]] (did you mean 'url'?)"


def test_unknown_key_without_close_match_lists_valid_keys(tmp_path: Path) -> None:
    path = write(tmp_path, REGISTRY + "zzzzzz = 1\n")
    assert (
        error_of(path)
        == f"{path}:17: unknown key 'zzzzzz' in [[endpoint]] (valid keys: endpoint_id, model, url, key, timeout, tries)"
    )


def test_missing_required_key(tmp_path: Path) -> None:
    path = write(
        tmp_path, REGISTRY.replace('model = "Qwen/Qwen3-4B"\nurl = "http://node2', 'url = "http://node2')
    )
    assert error_of(path) == f"{path}:13: missing required key 'model' in [[endpoint]]"


def test_bad_url(tmp_path: Path) -> None:
    path = write(tmp_path, REGISTRY.replace("http://node2:8000/v1", "node2:8000"))
    message = error_of(path)
    assert message.startswith(f"{path}:16: bad value for 'url' in [[endpoint]]: ")
    assert "'node2:8000' is not an http(s) URL" in message


def test_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, REGISTRY.replace('model = "gpt-4.1-mini"', "model = 4"))
    assert error_of(path).startswith(f"{path}:4: bad value for 'model' in [[endpoint]]: ")


def test_a_literal_key_is_refused_without_echoing_it(tmp_path: Path) -> None:
    secret = "sk-proj-abc123def456"
    path = write(tmp_path, REGISTRY.replace('key = "OPENAI_API_KEY"', f'key = "{secret}"'))
    message = error_of(path)
    assert message.startswith(f"{path}:6: bad value for 'key'")
    assert "NAME of an environment variable" in message
    assert secret not in message


def test_invalid_toml_names_line(tmp_path: Path) -> None:
    unterminated = REGISTRY.replace('url = "http://node1:8000/v1"', 'url = "http://node1:8000/v1')
    path = write(tmp_path, unterminated)
    assert error_of(path).startswith(f"{path}:11: invalid TOML: ")


def test_unknown_table(tmp_path: Path) -> None:
    path = write(tmp_path, REGISTRY + '\n[[endpoints]]\nendpoint_id = "x"\n')
    message = error_of(path)
    assert message == f"{path}:18: unknown table 'endpoints' (did you mean 'endpoint'?)"


def test_single_bracket_table(tmp_path: Path) -> None:
    path = write(tmp_path, '[endpoint]\nendpoint_id = "a"\nmodel = "a"\nurl = "http://h/v1"\n')
    assert error_of(path) == f"{path}:1: write [[endpoint]] (double brackets: one table per endpoint)"


def test_missing_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    path = write(tmp_path, REGISTRY)
    endpoints = load_endpoints(path)["gpt-4.1-mini"]
    with pytest.raises(UserError) as info:
        client_for_endpoint(endpoints)
    assert str(info.value) == (
        f"environment variable OPENAI_API_KEY (named by endpoint 'gpt-4.1-mini' in {path}) is not set"
    )


def test_client_for_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-live-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    registry = load_endpoints(write(tmp_path, REGISTRY))
    single = client_for_endpoint(registry["gpt-4.1-mini"], return_tokens=True)
    assert isinstance(single, OpenAIClient) and single.return_tokens and single.model == "gpt-4.1-mini"
    assert secret not in repr(single) and secret not in str(single)
    replicas = client_for_endpoint(registry["qwen"])
    assert isinstance(replicas, RoundRobinClient)
    urls = [c.base_url for c in replicas.clients]  # type: ignore[attr-defined]
    assert urls == ["http://node1:8000/v1", "http://node2:8000/v1"]
    assert replicas.model == "Qwen/Qwen3-4B"


def test_api_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WB_TEST_KEY", "k")
    monkeypatch.setenv("WB_EMPTY_KEY", "")
    assert api_key_from_env("WB_TEST_KEY") == "k"
    assert api_key_from_env("WB_EMPTY_KEY") is None
    assert api_key_from_env("WB_UNSET_KEY_12345") is None


def test_resolve_endpoint(tmp_path: Path) -> None:
    path = write(tmp_path, REGISTRY)
    assert [e.url for e in resolve_endpoint("qwen", path=path) or []] == [
        "http://node1:8000/v1",
        "http://node2:8000/v1",
    ]
    assert resolve_endpoint("tiny", path=path) is None  # not registered: a local model
    [adhoc] = (
        resolve_endpoint("my-model", path=path, base_url="http://localhost:8000/v1", api_key_var="MY_KEY")
        or []
    )
    assert (adhoc.model, adhoc.url, adhoc.key) == ("my-model", "http://localhost:8000/v1", "MY_KEY")
    with pytest.raises(UserError, match="bad --base-url"):
        resolve_endpoint("m", base_url="localhost:8000")
    registry = load_endpoints(path)
    assert resolve_endpoint("gpt-4.1-mini", endpoints=registry) == registry["gpt-4.1-mini"]


def test_adhoc_endpoint_missing_env_var_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WB_NOT_SET_KEY", raising=False)
    endpoints = resolve_endpoint("m", base_url="http://localhost:8000/v1", api_key_var="WB_NOT_SET_KEY") or []
    with pytest.raises(UserError, match="environment variable WB_NOT_SET_KEY .* is not set"):
        client_for_endpoint(endpoints)


def test_endpoint_is_not_a_secret_holder() -> None:
    # The model stores only the variable name, so dumping an endpoint can never leak a key.
    endpoint = Endpoint(endpoint_id="a", model="a", url="http://h/v1", key="A_KEY")
    assert endpoint.model_dump() == {
        "endpoint_id": "a",
        "model": "a",
        "url": "http://h/v1",
        "key": "A_KEY",
        "timeout": None,
        "tries": None,
    }


async def test_end_to_end_through_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    headers = HeaderRecorder()
    with serve_in_thread(make_app(EchoBackend("served"), middlewares=(headers.middleware,))) as base_url:
        text = f'[[endpoint]]\nendpoint_id = "local"\nmodel = "served"\nurl = "{base_url}/v1"\nkey = "WB_LOCAL_KEY"\n'
        monkeypatch.setenv("WB_LOCAL_KEY", "local-secret")
        [endpoint] = load_endpoints(write(tmp_path, text))["local"]
        client = client_for_endpoint([endpoint])
        try:
            [completion] = await client.chat([{"role": "user", "content": "abc"}], sampling=SamplingParams())
        finally:
            await client.close()
    assert completion.message["content"] == "cba"
    assert headers.seen[0]["Authorization"] == "Bearer local-secret"
