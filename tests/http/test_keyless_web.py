"""Keyless mode against web pages (issue 36, "Keyless mode, safe by default"): a daemon with no
``--api-key``/``--keys`` answers only its own Host names (DNS rebinding, the class of Ollama's
CVE-2024-28224) and only allowed browser Origins (cross-site requests); a browser's body must be
JSON, while curl's and LiteLLM's (no Origin) are read as JSON whatever they declare; the CORS
policy answers the allowed origins. Through a real daemon on the real model; the policy's
decisions alone are ``pure``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from llamactor.http.origins import OriginPolicy

from tests.support.daemon import MODEL_ID, Daemon, start_daemon

APP = "https://app.example"  # the operator's --allowed-origins
GENERATE = {"model": MODEL_ID, "prompt": "Hello", "stream": False, "options": {"num_predict": 2}}


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "2", "--allowed-origins", APP, "--allowed-hosts", "llm.internal")
    yield d
    d.stop()


def generate(daemon: Daemon, headers: dict[str, str], body: bytes | None = None) -> httpx.Response:
    content = json.dumps(GENERATE).encode() if body is None else body
    return httpx.post(f"{daemon.url}/api/generate", content=content, headers=headers, timeout=60)


def test_a_foreign_host_is_refused_as_a_dns_rebinding_page_would_send_it(daemon: Daemon) -> None:
    for path in ("/v1/models", "/", "/ui/"):
        r = httpx.get(f"{daemon.url}{path}", headers={"Host": f"attacker.example:{daemon.port}"})
        assert r.status_code == 403, path
    posted = generate(daemon, {"Host": f"rebound.attacker.example:{daemon.port}", "Content-Type": "application/json"})
    assert posted.status_code == 403 and "Host is not allowed" in posted.json()["error"]  # Ollama's error shape
    openai_shape = httpx.post(f"{daemon.url}/v1/completions", json={"model": MODEL_ID, "prompt": "hi"},
                              headers={"Host": "attacker.example"})
    assert openai_shape.status_code == 403 and openai_shape.json()["error"]["code"] == "host_not_allowed"
    for host in (f"localhost:{daemon.port}", f"127.0.0.1:{daemon.port}", f"[::1]:{daemon.port}", "llm.internal"):
        assert httpx.get(f"{daemon.url}/v1/models", headers={"Host": host}).status_code == 200, host


def test_a_foreign_origin_is_refused(daemon: Daemon) -> None:
    for origin in ("https://evil.example", "http://127.0.0.1.evil.example", "null"):
        r = generate(daemon, {"Origin": origin, "Content-Type": "application/json"})
        assert r.status_code == 403 and "Origin is not allowed" in r.json()["error"], origin
        assert "access-control-allow-origin" not in r.headers
    assert httpx.get(f"{daemon.url}/v1/models", headers={"Origin": "https://evil.example"}).status_code == 403
    preflight = httpx.options(f"{daemon.url}/v1/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers


def test_a_browsers_text_plain_body_is_refused_but_curls_and_litellms_are_read_as_json(daemon: Daemon) -> None:
    # A "simple request" (no CORS preflight) from a page: text/plain or a form, with an Origin.
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        refused = generate(daemon, {"Origin": f"http://localhost:{daemon.port + 1}", "Content-Type": content_type})
        assert refused.status_code == 415, content_type
        assert "Content-Type: application/json" in refused.json()["error"]
    # No Origin: curl -d (form), a text/plain body, LiteLLM's Ollama provider (no Content-Type)
    for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}, {}):
        answered = generate(daemon, headers)
        assert answered.status_code == 200, (headers, answered.text[:200])
        assert answered.json()["done"] is True and answered.json()["eval_count"] == 2


def test_an_allowed_origin_works_with_cors_and_so_do_the_daemons_own_pages(daemon: Daemon) -> None:
    preflight = httpx.options(f"{daemon.url}/v1/chat/completions", headers={
        "Origin": APP, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == APP
    answered = generate(daemon, {"Origin": APP, "Content-Type": "application/json"})
    assert answered.status_code == 200 and answered.json()["eval_count"] == 2
    assert answered.headers["access-control-allow-origin"] == APP
    assert "x-request-id" in answered.headers["access-control-expose-headers"]
    local = generate(daemon, {"Origin": "http://localhost:5173", "Content-Type": "application/json"})
    assert local.status_code == 200 and local.headers["access-control-allow-origin"] == "http://localhost:5173"
    own = generate(daemon, {"Origin": daemon.url, "Content-Type": "application/json"})  # /ui/'s fetches
    assert own.status_code == 200


# -- the policy's decisions, model-free ------------------------------------------------------

@pytest.mark.pure
@pytest.mark.parametrize(("bind", "host", "allowed"), [
    ("127.0.0.1", "localhost:8000", True), ("127.0.0.1", "127.0.0.1:8000", True), ("127.0.0.1", "[::1]:8000", True),
    ("127.0.0.1", "app.localhost", True), ("127.0.0.1", "10.1.2.3:8000", True),  # an IP literal is never rebound
    ("127.0.0.1", "attacker.example:8000", False), ("127.0.0.1", "localhost.attacker.example", False),
    ("0.0.0.0", "box.lan:8000", False), ("box.lan", "BOX.lan:8000", True), (None, "anything", True)])
def test_the_host_check(bind: str | None, host: str, allowed: bool) -> None:
    assert OriginPolicy(bind_host=bind).host_allowed(host) is allowed
    assert OriginPolicy(allowed_hosts=("*",), bind_host=bind).host_allowed(host)


@pytest.mark.pure
@pytest.mark.parametrize(("origin", "allowed"), [
    ("http://localhost:3000", True), ("https://127.0.0.1", True), ("http://[::1]:8080", True),
    ("http://box.lan:8000", True),  # same origin as the request's Host
    ("https://app.example", True), ("https://APP.example/", True), ("http://app.example", False),
    ("https://evil.example", False), ("null", False), ("file://", False), ("chrome-extension://abc", False),
    ("http://0.0.0.0:8000", False), ("app://desktop", True), ("app://other", False)])
def test_the_origin_check(origin: str, allowed: bool) -> None:
    policy = OriginPolicy(allowed_origins=("https://app.example", "app://desktop"), bind_host="0.0.0.0")
    assert policy.origin_allowed(origin, "box.lan:8000") is allowed
    assert OriginPolicy(allowed_origins=("*",)).origin_allowed(origin)
