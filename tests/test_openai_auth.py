"""The OpenAI API's key check on its own (no Triton): which paths need a key, what a refusal looks like. The
real server with the official openai client: tests/test_serve_cli.py."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from trtspec.openai.auth import RequireAPIKey, require_api_key


def _app(*keys: str) -> TestClient:
    app = FastAPI()
    app.get("/v1/models")(lambda: {"data": []})
    app.get("/health")(lambda: {"status": "ok"})
    require_api_key(app, keys)
    return TestClient(app)


def test_v1_paths_need_one_of_the_keys() -> None:
    client = _app("k1", "k2")
    assert client.get("/v1/models", headers={"Authorization": "Bearer k1"}).status_code == 200
    assert client.get("/v1/models", headers={"Authorization": "bearer k2"}).status_code == 200  # scheme: any case
    assert _app("schlüssel").get("/v1/models", headers={"Authorization": "Bearer schlüssel".encode()}).status_code == 200
    for headers in ({}, {"Authorization": "Bearer k3"}, {"Authorization": "Basic k1"}, {"Authorization": "Bearer "}):
        r = client.get("/v1/models", headers=headers)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key" and "k3" not in r.text


def test_health_docs_and_preflight_stay_open() -> None:
    client = _app("k1")
    assert client.get("/health").status_code == 200
    assert client.get("/openapi.json").status_code == 200
    assert client.options("/v1/models").status_code != 401  # a browser's CORS preflight carries no credentials


def test_no_key_leaves_the_api_open() -> None:
    assert _app().get("/v1/models").status_code == 200
    assert _app("").get("/v1/models").status_code == 200  # an empty TRTSPEC_API_KEY is no key
    with pytest.raises(ValueError):
        RequireAPIKey(FastAPI(), [""])
