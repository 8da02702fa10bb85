"""What a tenant learns of the server, through the real daemon with ``--keys`` and the official
clients: model and adapter names, never a file path on the server's disk (``/v1/models``,
``/v1/models/{id}``, ``/lora-adapters``, ``/api/show``, ``/api/tags``, ``/api/ps``), and neither
the operator's system prompt nor the Modelfile (``/api/show``). An admin sees them, and so does
every caller of a daemon without keys (the local user)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.support.adapters import write_lora
from tests.support.daemon import MODEL_ID, Daemon, start_daemon
from tests.support.keys import write_keys_file

TENANT_KEY, ADMIN_KEY = "sk-alice-views-1", "sk-ops-views-002"
KEY_TABLES = {TENANT_KEY: {"tenant": "alice"}, ADMIN_KEY: {"tenant": "ops", "admin": True}}
SYSTEM = "You are the harbour master's assistant. Internal note: the vault code is 4417."


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory, model_path: str) -> Path:
    return write_lora(tmp_path_factory.mktemp("private-adapters") / "style.gguf", model_path)


def serve(lora: Path, *args: str) -> Iterator[Daemon]:
    d = start_daemon("--system", SYSTEM, "--lora", f"style={lora}", *args)
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, lora: Path) -> Iterator[Daemon]:
    keys = write_keys_file(tmp_path_factory.mktemp("keys"), KEY_TABLES)
    yield from serve(lora, "--keys", str(keys))


def views(daemon: Daemon, key: str | None) -> dict[str, Any]:
    """Every listing and description a caller with ``key`` can read, by route."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    get = httpx.Client(base_url=daemon.url, headers=headers, timeout=60)
    api = ollama.Client(host=daemon.url, headers=headers)
    out = {route: get.get(route) for route in ("/v1/models", f"/v1/models/{MODEL_ID}", "/v1/models/style",
                                               "/lora-adapters", "/api/tags", "/api/ps")}
    out = {route: r.raise_for_status().json() for route, r in out.items()}
    out["/api/show"] = api.show(MODEL_ID).model_dump(exclude_none=True)
    out["/api/show raw"] = get.post("/api/show", json={"model": MODEL_ID, "verbose": True}).raise_for_status().json()
    return out


def test_a_tenant_sees_names_but_no_path_and_neither_the_system_prompt_nor_the_modelfile(
        daemon: Daemon, lora: Path, model_path: str) -> None:
    seen = views(daemon, TENANT_KEY)
    text = repr(seen)
    for secret in (os.path.dirname(os.path.realpath(model_path)), str(lora.parent), "vault code"):
        assert secret not in text, f"a tenant reads {secret!r}"
    assert {m["id"] for m in seen["/v1/models"]["data"]} == {MODEL_ID, "style"}
    assert seen["/v1/models/style"]["root"] == "style" and seen["/v1/models/style"]["parent"] == MODEL_ID
    assert [(a["id"], a["name"]) for a in seen["/lora-adapters"]] == [(0, "style")]
    assert "modelfile" not in seen["/api/show raw"] and "system" not in seen["/api/show raw"]
    assert seen["/api/show"]["template"] and seen["/api/show"]["details"]["format"] == "gguf"
    assert [m["name"] for m in seen["/api/tags"]["models"]] == [f"{MODEL_ID}:latest"]


def test_an_admin_sees_the_paths_the_system_prompt_and_the_modelfile(
        daemon: Daemon, lora: Path, model_path: str) -> None:
    seen = views(daemon, ADMIN_KEY)
    [listed] = [m for m in seen["/v1/models"]["data"] if m["id"] == MODEL_ID]
    assert os.path.realpath(listed["path"]) == os.path.realpath(model_path)
    assert seen["/v1/models/style"]["root"] == str(lora) and seen["/lora-adapters"][0]["path"] == str(lora)
    show = seen["/api/show raw"]
    assert show["system"] == SYSTEM and SYSTEM in show["modelfile"] and "FROM /" in show["modelfile"]


def test_without_keys_the_local_user_is_the_operator_and_sees_everything(lora: Path) -> None:
    for d in serve(lora):
        seen = views(d, None)
        assert seen["/api/show raw"]["system"] == SYSTEM and "modelfile" in seen["/api/show raw"]
        assert seen["/lora-adapters"][0]["path"] == str(lora)
        assert all("path" in m for m in seen["/v1/models"]["data"] if m["id"] == MODEL_ID)
