"""``GET /engine/events`` and the pages over real HTTP (httpx) on a real daemon with tenants' keys:
the live snapshots while a request streams (whose tenant holds the engine too), admin keys only, the pages open and sent with their
Content-Security-Policy, ``/`` for browsers and for everyone else, and ``llamactor top --once``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.daemon import Daemon, start_daemon
from tests.support.keys import write_keys_file

ADMIN, TENANT = "sk-ops-admin-01", "sk-bob-plain-02"
KEY_TABLES = {ADMIN: {"tenant": "ops", "admin": True}, TENANT: {"tenant": "bob"}}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    keys = write_keys_file(tmp_path_factory.mktemp("keys"), KEY_TABLES)
    d = start_daemon("--keys", str(keys))
    yield d
    d.stop()


def snapshots(daemon: Daemon, key: str, interval_s: float = 0.1) -> Iterator[dict[str, Any]]:
    with httpx.stream("GET", f"{daemon.url}/engine/events", params={"interval_s": interval_s},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                yield json.loads(line[6:])


def test_the_engine_events_show_a_streaming_request_running_and_its_tokens_per_second(daemon: Daemon) -> None:
    client = daemon.client(ADMIN, timeout=60)
    # A raw completion: a chat on Gemma's transcript ends at the next turn marker, which
    # ignore_eos does not lift (the answer could end after a few steps, before a snapshot saw it).
    stream = client.completions.create(model="m", prompt="Once upon a time", max_tokens=2000, stream=True,
                                       extra_body={"ignore_eos": True})
    try:
        next(iter(stream))  # it has started
        events = snapshots(daemon, ADMIN)
        first = next(events)
        assert first["interval_s"] == 0 and first["figures"]["tokens_per_s"] == 0
        for seen, snapshot in enumerate(events):  # the first that shows it decoding, within 600 events (60 s)
            f = snapshot["figures"]
            if f["running"] >= 1 and f["tokens_per_s"] > 0:
                break
            assert seen < 600, f"no running sequence shown: {snapshot}"
        events.close()
        assert f["kv_used"] > 0 and f["steps"] > 0 and f["kv_free"] == f["kv_size"] - f["kv_used"]
        assert 0 < snapshot["interval_s"] < 5
        model = snapshot["models"][0]
        assert model["state"] == "ready" and model["figures"]["running"] == f["running"]
        assert model["replicas"][0]["figures"]["running"] == f["running"]
        assert snapshot["jobs"] == []
        assert snapshot["tenants"] == [{"name": "ops", "running": f["running"], "waiting": f["waiting"]}]
    finally:
        stream.close()


def test_the_engine_events_are_for_admin_keys_once_keys_exist(daemon: Daemon) -> None:
    missing = httpx.get(f"{daemon.url}/engine/events")
    assert missing.status_code == 401
    plain = httpx.get(f"{daemon.url}/engine/events", headers={"Authorization": f"Bearer {TENANT}"})
    assert plain.status_code == 403
    assert plain.json()["error"]["message"] == "the engine view is for admin keys"


def test_the_pages_need_no_key_and_forbid_every_other_origin(daemon: Daemon) -> None:
    for path, kind in (("/ui/", "text/html"), ("/ui/engine", "text/html"), ("/ui/chat.js", "text/javascript"),
                       ("/ui/markdown.js", "text/javascript"), ("/ui/style.css", "text/css"),
                       ("/ui/favicon.svg", "image/svg+xml")):
        response = httpx.get(daemon.url + path)
        assert response.status_code == 200, path
        assert response.headers["content-type"].startswith(kind), path
        csp = response.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "connect-src 'self'" in csp and "script-src 'self'" in csp
        assert "http" not in csp and "*" not in csp, "the policy names another origin"
    assert b'data-metric="running"' in httpx.get(daemon.url + "/ui/engine").content
    assert httpx.get(daemon.url + "/ui/nothing.js").status_code == 404
    assert httpx.get(daemon.url + "/ui/..%2Fserver.py").status_code == 404
    assert httpx.get(daemon.url + "/ui").headers["location"] == "/ui/"


def test_a_browser_at_the_root_is_sent_to_the_chat_page_and_every_other_client_hears_ollama(daemon: Daemon) -> None:
    browser = httpx.get(daemon.url + "/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert browser.status_code == 302 and browser.headers["location"] == "/ui/"
    for accept in ("*/*", "application/json", None):
        other = httpx.get(daemon.url + "/", headers={"Accept": accept} if accept else {})
        assert (other.status_code, other.text) == (200, "Ollama is running")
    assert httpx.head(daemon.url + "/", headers={"Accept": "text/html"}).status_code == 200


def test_llamactor_top_once_prints_the_engine_view_of_a_daemon(daemon: Daemon) -> None:
    env = {**os.environ, "COLUMNS": "160", "LLAMACTOR_API_KEY": ADMIN}
    done = subprocess.run([sys.executable, "-m", "llamactor.cli", "top", daemon.url, "--once", "--interval", "0.1"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    for expected in ("running", "tokens/s", "KV free", "decode", "prefill", "gemma-3-270m-q4_k_m", "ready"):
        assert expected in done.stdout, expected


def test_llamactor_top_draws_a_tenants_running_stream_as_sparklines_and_its_share(daemon: Daemon) -> None:
    client = daemon.client(TENANT, timeout=60)
    stream = client.completions.create(model="m", prompt="Once upon a time", max_tokens=2000, stream=True,
                                       extra_body={"ignore_eos": True})
    try:
        next(iter(stream))  # it has started: every snapshot top reads shows it running
        env = {**os.environ, "COLUMNS": "200", "LLAMACTOR_API_KEY": ADMIN}
        done = subprocess.run([sys.executable, "-m", "llamactor.cli", "top", daemon.url, "--once", "--interval",
                               "0.1"], capture_output=True, text=True, timeout=60, env=env)
    finally:
        stream.close()
    assert done.returncode == 0, done.stderr
    cells = [line.strip("│ ").replace("│", " ").split() for line in done.stdout.splitlines()]
    running = next(c for c in cells if c[:1] == ["running"] and len(c) == 4)  # label, sparkline, now, max
    assert set(running[1]) == {"█"} and len(running[1]) >= 10 and running[2:] == ["1", "1"], done.stdout
    assert next(c for c in cells if c[:1] == ["bob"])[1:3] == ["1", "0"], done.stdout  # running, waiting
    for label in ("tokens/s", "KV use", "cache hits/s", "rows: decode", "rows: prefill"):
        assert any(" ".join(c).startswith(label) for c in cells), label


def test_llamactor_top_says_why_when_the_key_is_refused(daemon: Daemon) -> None:
    done = subprocess.run([sys.executable, "-m", "llamactor.cli", "top", daemon.url, "--once",
                           "--api-key", TENANT], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "LLAMACTOR_API_KEY"})
    assert done.returncode != 0
    assert "403" in done.stderr and "the engine view is for admin keys" in done.stderr


@pytest.mark.pure
def test_the_pages_ship_inside_the_package() -> None:
    from importlib import resources

    folder = resources.files("llamactor.http") / "ui"
    names = {f.name for f in folder.iterdir()}
    assert {"index.html", "engine.html", "chat.js", "engine.js", "charts.js", "markdown.js", "common.js",
            "style.css"} <= names
    source = Path(__file__).resolve().parents[2] / "actors" / "http" / "ui"
    for page in source.iterdir():
        text = page.read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text, page.name


def test_an_open_engine_view_does_not_hold_up_the_drain_on_sigterm() -> None:
    """The stream ends as the daemon drains, so the drain is not left waiting for its timeout."""
    d = start_daemon("--drain-timeout", "60")
    try:
        events = snapshots(d, "any")
        next(events)
        d.process.send_signal(signal.SIGTERM)
        assert d.process.wait(30) == 0
        assert list(events) is not None  # the stream ended cleanly: no error while reading it
    finally:
        d.stop()
