"""The daemon's life as a real subprocess: starting, failing to start, SIGTERM, a Unix socket; and
in-process, where uvicorn's start must be held back (ready is said only once a client can connect).

Each test starts its own daemon (test_daemon.py shares one among the request tests)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading

import httpx
import pytest

from tests.support.daemon import MODEL_ID, start_daemon


def test_sigterm_finishes_in_flight_requests_then_exits_zero() -> None:
    d = start_daemon("--n-parallel", "2")
    client = d.client()
    stream = client.completions.create(model=MODEL_ID, prompt="Tell a story:", max_tokens=40, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    first = next(chunks)
    done = threading.Event()
    rest: list = []

    def drain() -> None:
        rest.extend(chunks)
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    assert d.stop(timeout=60) == 0
    assert done.wait(30)
    assert rest[-1].choices[0].finish_reason == "length"
    assert len("".join(c.choices[0].text for c in [first, *rest])) > 0


def test_a_model_that_cannot_load_exits_non_zero_with_a_one_line_reason(tmp_path) -> None:
    missing = subprocess.run([sys.executable, "-m", "llamactor.cli", "serve", "--model", str(tmp_path / "nope.gguf")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "model file not found" in missing.stderr
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model")
    d = start_daemon("--model", str(bogus), wait_ready=False)
    assert d.process.wait(60) == 1
    assert any("cannot load the model" in line.get("text", "") for line in d.log_lines)


@pytest.mark.pure
def test_while_the_model_loads_health_and_requests_answer_503_json() -> None:
    from fastapi.testclient import TestClient

    from llamactor.http.server import create_app
    from llamactor.http.state import ServerState

    client = TestClient(create_app(ServerState([MODEL_ID], api_key=None, max_body_bytes=1 << 20)),
                        base_url="http://127.0.0.1")  # keyless: the Host must be one of ours
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "loading"
    r = client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "batcher_unavailable"
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL_ID


def test_the_daemon_can_listen_on_a_unix_socket(tmp_path) -> None:
    sock = str(tmp_path / "llamactor.sock")
    d = start_daemon("--uds", sock, "--n-parallel", "1")
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://llamactor") as client:
            assert client.get("/health").json()["status"] == "ready"
            r = client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2
    finally:
        assert d.stop() == 0


def test_model_ready_is_logged_only_once_a_client_can_connect(monkeypatch, tmp_path, model_path) -> None:
    """``model_ready`` is what supervisors and tests wait for: it must not come before uvicorn has
    bound the socket, even when the model loads before the server starts. Here uvicorn binds only
    once the loader is about to say it is ready (or has said it)."""
    from llamactor.base.config import Config
    from llamactor.http import daemon
    from llamactor.serving.model_specs import ModelSpec
    from tests.support.daemon import free_port

    port, at_ready, servers, connectable = free_port(), threading.Event(), [], []
    original_init, original_startup = daemon._DrainingServer.__init__, daemon._DrainingServer.startup
    original_info = daemon.log.info

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        servers.append(self)
        self.listening = _Announcing(self.listening, at_ready)

    async def late_startup(self, sockets=None):  # uvicorn's loop: binds once the loader is at "ready"
        await asyncio.get_running_loop().run_in_executor(None, at_ready.wait, 60)
        await original_startup(self, sockets)

    def watching_info(event, **kw):  # the loader thread: can a client connect when ready is said?
        if event == "model_ready":
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                connectable.append(True)
            except OSError:
                connectable.append(False)
            at_ready.set()
        if event == "router_ready":
            servers[0].should_exit = True
        return original_info(event, **kw)

    monkeypatch.setattr(daemon._DrainingServer, "__init__", init)
    monkeypatch.setattr(daemon._DrainingServer, "startup", late_startup)
    monkeypatch.setattr(daemon.log, "info", watching_info)
    spec = ModelSpec(name="m", config=Config(model=model_path, n_parallel=1, n_ctx=512))
    code = daemon.serve(host="127.0.0.1", port=port, uds=None, api_key=None, drain_timeout_s=1,
                        max_body_bytes=1 << 20, models=[spec], data_dir=str(tmp_path))
    assert code == 0 and connectable == [True]


class _Announcing:
    """An event whose waiter first says it is waiting (``at_ready``): the loader about to say ready."""

    def __init__(self, event: threading.Event, at_ready: threading.Event) -> None:
        self.event, self.at_ready = event, at_ready

    def set(self) -> None:
        self.event.set()

    def wait(self, timeout: float | None = None) -> bool:
        self.at_ready.set()
        return self.event.wait(timeout)
