"""The daemon's life as a real subprocess: starting, failing to start, SIGTERM, a Unix socket.

Each test starts its own daemon (test_daemon.py shares one among the request tests)."""

from __future__ import annotations

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
