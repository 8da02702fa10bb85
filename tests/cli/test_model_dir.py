"""``llamactor serve --models-dir``: a folder holding Gemma 3 270M (base), SmolLM2-135M-Instruct,
a LoRA adapter, a projector and a broken file, served as llama-server's router mode serves one,
through the official clients, on the real engine. One model loaded at a time (``--max-loaded 1``);
tenants' keys make loading and unloading an admin's. Each test first unloads what an earlier one
left loaded (``start_from_nothing_loaded``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest
from click.testing import CliRunner

from llamactor.cli.commands import main

from tests.support.daemon import Daemon, start_daemon, wait_until
from tests.support.keys import write_keys_file
from tests.support.model_dir import model_folder

ADMIN, USER = "sk-admin-key", "sk-user-key"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: str, instruct_path: str) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("served")
    folder = model_folder(root / "models", model_path, instruct_path)
    keys = write_keys_file(root, {ADMIN: {"tenant": "ops", "admin": True}, USER: {"tenant": "alice"}})
    d = start_daemon("--models-dir", str(folder), "--max-loaded", "1", "--keys", str(keys), "--n-parallel", "2",
                     "--load-on-request", "tenants",  # alice's first requests load each model
                     "--n-ctx", "1024")
    wait_until(lambda: listening(d), "the socket to open")  # nothing preloads: the router is ready at once
    yield d
    d.stop()


def listening(daemon: Daemon) -> bool:
    try:
        return httpx.get(f"{daemon.url}/health").status_code == 200
    except httpx.ConnectError:
        return False


def post(daemon: Daemon, path: str, body: dict, key: str = ADMIN) -> httpx.Response:
    return httpx.post(f"{daemon.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def statuses(daemon: Daemon) -> dict[str, str]:
    listed = httpx.get(f"{daemon.url}/models", headers={"Authorization": f"Bearer {USER}"}).json()["data"]
    return {m["id"]: m["status"]["value"] for m in listed}


@pytest.fixture
def start_from_nothing_loaded(daemon: Daemon) -> Daemon:
    for name, status in statuses(daemon).items():
        if status == "loaded":
            assert post(daemon, "/models/unload", {"model": name}).json() == {"success": True}
    return daemon


def test_both_models_of_the_folder_serve_by_name_loading_on_first_request_one_at_a_time(
        start_from_nothing_loaded: Daemon) -> None:
    daemon = start_from_nothing_loaded
    client = daemon.client(api_key=USER)
    listed = {m.id: m.model_extra for m in client.models.list().data}
    assert sorted(listed) == ["broken", "gemma", "smol"]  # the adapter and the projector are not models
    assert {n: m["status"]["value"] for n, m in listed.items()} == {"broken": "unloaded", "gemma": "unloaded",
                                                                     "smol": "unloaded"}
    files = {m.id: m.model_extra for m in daemon.client(api_key=ADMIN).models.list().data}  # paths: admins only
    assert "path" not in listed["smol"] and files["smol"]["path"].endswith("smol.gguf")
    assert listed["smol"]["size"] == Path(files["smol"]["path"]).stat().st_size
    answer = client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=12, temperature=0)
    assert answer.model == "smol" and "Paris" in answer.choices[0].message.content  # through its ChatML template
    assert statuses(daemon) == {"broken": "unloaded", "gemma": "unloaded", "smol": "loaded"}
    text = client.completions.create(model="gemma", prompt="The capital of France is", max_tokens=3, temperature=0)
    assert text.model == "gemma" and text.usage.completion_tokens == 3
    assert statuses(daemon) == {"broken": "unloaded", "gemma": "loaded", "smol": "unloaded"}  # max_loaded 1: evicted
    tags = ollama.Client(host=daemon.url, headers={"Authorization": f"Bearer {USER}"}).list()
    assert sorted(m.model for m in tags.models) == ["broken:latest", "gemma:latest", "smol:latest"]


def test_models_load_and_unload_by_name_for_admins_only(start_from_nothing_loaded: Daemon) -> None:
    daemon = start_from_nothing_loaded
    assert post(daemon, "/models/load", {"model": "smol"}).json() == {"success": True}
    assert statuses(daemon)["smol"] == "loaded"
    again = post(daemon, "/models/load", {"model": "smol"})
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    assert post(daemon, "/models/load", {"model": "gemma"}).json() == {"success": True}
    assert statuses(daemon) == {"broken": "unloaded", "gemma": "loaded", "smol": "unloaded"}
    assert post(daemon, "/models/unload", {"model": "gemma"}).json() == {"success": True}
    assert statuses(daemon)["gemma"] == "unloaded"
    not_loaded = post(daemon, "/models/unload", {"model": "gemma"})
    assert not_loaded.status_code == 400 and "not loaded" in not_loaded.json()["error"]["message"]
    unknown = post(daemon, "/models/load", {"model": "poet"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    for path in ("/models/load", "/models/unload"):
        refused = post(daemon, path, {"model": "smol"}, key=USER)
        assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
    assert statuses(daemon)["smol"] == "unloaded"


def test_a_broken_file_is_a_clear_error_naming_it_and_the_other_models_keep_serving(
        start_from_nothing_loaded: Daemon) -> None:
    daemon = start_from_nothing_loaded
    client = daemon.client(api_key=USER)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="broken", messages=QUESTION, max_tokens=2)
    error = caught.value.body
    assert error["code"] == "model_load_error" and error["model"] == "broken"
    assert "could not be loaded from" in error["message"] and "broken.gguf" in error["message"]
    assert "GGUF header cannot be read" in error["message"]
    listed = {m["id"]: m["status"] for m in httpx.get(f"{daemon.url}/models",
                                                     headers={"Authorization": f"Bearer {USER}"}).json()["data"]}
    assert listed["broken"]["value"] == "unloaded" and listed["broken"]["failed"] is True
    assert "broken.gguf" in listed["broken"]["error"] and "/broken.gguf" not in listed["broken"]["error"]  # no folder
    loading = post(daemon, "/models/load", {"model": "broken"})
    assert loading.status_code == 500 and "broken.gguf" in loading.json()["error"]["message"]
    answer = client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=4, temperature=0)
    assert answer.usage.completion_tokens >= 1 and httpx.get(f"{daemon.url}/health").json()["status"] == "ready"


def test_the_tokenizer_and_template_endpoints_take_the_model_to_use(start_from_nothing_loaded: Daemon) -> None:
    daemon = start_from_nothing_loaded

    def tokens(model: str) -> list[int]:
        return post(daemon, "/tokenize", {"model": model, "content": "The capital of France"}, key=USER).json()["tokens"]

    assert tokens("smol") != tokens("gemma")  # two vocabularies (49k and 262k)
    rendered = post(daemon, "/apply-template", {"model": "smol", "messages": QUESTION}, key=USER).json()["prompt"]
    assert rendered.startswith("<|im_start|>") and "What is the capital of France?" in rendered  # SmolLM2's ChatML
    text = post(daemon, "/detokenize", {"model": "gemma", "tokens": tokens("gemma")}, key=USER).json()["content"]
    assert text.endswith("The capital of France")


def test_the_models_command_lists_a_daemons_models_with_their_status(start_from_nothing_loaded: Daemon) -> None:
    daemon = start_from_nothing_loaded
    assert post(daemon, "/models/load", {"model": "smol"}).json() == {"success": True}
    result = CliRunner().invoke(main, ["models", "--url", daemon.url, "--api-key", USER])
    assert result.exit_code == 0, result.output
    rows = [line.split()[:2] for line in result.output.splitlines()]
    assert rows == [["NAME", "STATUS"], ["broken", "unloaded"], ["gemma", "unloaded"], ["smol", "loaded"]]
    refused = CliRunner().invoke(main, ["models", "--url", daemon.url])  # no key
    assert refused.exit_code == 1 and "cannot list the models" in refused.output
