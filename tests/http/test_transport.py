"""The daemon's HTTP edge against hostile and careless callers (issue 36, "The transport"), through
a real daemon on raw sockets and httpx: the key is checked from the headers before the body is
read, a stalled body or head ends in time, request heads and connections are bounded, the
request counter is labelled by route template, a client's X-Request-Id is bounded. Model-free
parts (the options, the request id rule, the route labels) are ``pure``."""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Iterator

import httpx
import pytest
from click.testing import CliRunner

from llamactor.base.config import Config
from llamactor.base.errors import InvalidRequestError
from llamactor.cli import options
from llamactor.cli.serve import serve
from llamactor.http.metrics import UNMATCHED
from llamactor.http.middleware import client_request_id
from llamactor.http.server import create_app
from llamactor.http.state import ServerState

from tests.support.daemon import API_KEY, Daemon, start_daemon

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SOCKET_WAIT_S = 20  # a bounded wait on a socket: the daemon answers (or closes) well before


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--api-key", API_KEY, "--n-parallel", "2", "--body-timeout", "1", "--header-timeout", "1")
    yield d
    d.stop()


def raw_exchange(daemon: Daemon, head: bytes, body: bytes = b"") -> tuple[bytes, bool]:
    """Send ``head`` (and ``body``) on a fresh connection, send nothing more, and read until the
    daemon closes it: (what it answered, whether it closed the connection)."""
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=SOCKET_WAIT_S) as sock:
        sock.sendall(head + body)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            return received, False
        except ConnectionResetError:
            pass
        return received, True


def post_head(path: str, length: int, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             f"Content-Length: {length}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_an_unauthenticated_upload_gets_its_401_from_the_headers_and_its_connection_closed(daemon: Daemon) -> None:
    # The body (a megabyte announced, never sent) is not waited for: 401 at once, the connection freed.
    for path in ("/v1/files", "/v1/chat/completions", "/api/generate"):
        answer, closed = raw_exchange(daemon, post_head(path, 1_000_000))
        assert answer.startswith(b"HTTP/1.1 401"), (path, answer[:100])
        assert closed and b"connection: close" in answer.lower()
    wrong_key, closed = raw_exchange(daemon, post_head("/v1/completions", 1_000_000, "Authorization: Bearer nope"))
    assert wrong_key.startswith(b"HTTP/1.1 401") and closed


def test_a_stalled_authenticated_body_ends_with_408_after_the_body_timeout(daemon: Daemon) -> None:
    answer, closed = raw_exchange(daemon, post_head("/v1/completions", 100, f"Authorization: Bearer {API_KEY}"),
                                  b'{"model": ')  # 10 of the 100 bytes announced, then silence
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer and closed
    assert daemon.wait_for_log(lambda e: e.get("event") == "http_request" and e.get("status") == 408)


def test_a_trickled_request_head_is_closed_after_the_header_timeout(daemon: Daemon) -> None:
    answer, closed = raw_exchange(daemon, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
    assert closed and answer == b""


def test_a_request_head_over_max_header_bytes_is_refused(daemon: Daemon) -> None:
    big = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 100_000 + b"\r\n\r\n"
    answer, closed = raw_exchange(daemon, big)
    assert closed and answer.startswith(b"HTTP/1.1 431"), answer[:100]
    trickled, closed = raw_exchange(daemon, big[:50_000])  # incomplete: the head bound (edge_protocol) gives up past the limit
    assert closed and trickled.startswith(b"HTTP/1.1 400"), trickled[:100]
    assert httpx.get(f"{daemon.url}/health", headers={"X-Padding": "a" * 8000}).status_code == 200  # 8 KB: fine


def http_request_series(daemon: Daemon) -> set[str]:
    text = httpx.get(f"{daemon.url}/metrics", headers=AUTH).text
    return set(re.findall(r"^llamactor_http_requests_total\{.*$", text, re.M))


def test_random_paths_add_no_metric_series_and_a_route_is_labelled_by_its_template(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url) as client:
        client.get("/v1/models")  # the 401 series of a known route, before counting
        before = {s.rpartition(" ")[0] for s in http_request_series(daemon)}
        for i in range(150):
            assert client.get(f"/random-{uuid.uuid4().hex}").status_code == 401  # no key
            assert client.get(f"/v1/files/file-{i}", headers=AUTH).status_code == 404
            assert client.get(f"/nothing/{uuid.uuid4().hex}", headers=AUTH).status_code == 404
    after = {s.rpartition(" ")[0] for s in http_request_series(daemon)}
    added = after - before - {s for s in after if "/metrics" in s}
    assert added <= {f'llamactor_http_requests_total{{path="{UNMATCHED}",status="401"}}',
                     f'llamactor_http_requests_total{{path="{UNMATCHED}",status="404"}}',
                     'llamactor_http_requests_total{path="/v1/files/{file_id}",status="404"}'}, added
    assert 'llamactor_http_requests_total{path="/v1/files/{file_id}",status="404"}' in after


def test_a_client_request_id_is_echoed_only_when_short_and_printable(daemon: Daemon) -> None:
    long_id = "x" * 10_000
    refused = httpx.get(f"{daemon.url}/v1/models", headers={**AUTH, "X-Request-Id": long_id})
    assert refused.status_code == 200 and re.fullmatch("[0-9a-f]{16}", refused.headers["x-request-id"])
    spaced = httpx.get(f"{daemon.url}/v1/models", headers={**AUTH, "X-Request-Id": "two words"})
    assert re.fullmatch("[0-9a-f]{16}", spaced.headers["x-request-id"])
    kept = httpx.get(f"{daemon.url}/v1/models", headers={**AUTH, "X-Request-Id": "trace-42/a.b"})
    assert kept.headers["x-request-id"] == "trace-42/a.b"
    assert daemon.wait_for_log(lambda e: e.get("client_request_id") == "trace-42/a.b")
    own = refused.headers["x-request-id"]
    line = next(e for e in daemon.events("http_request") if e.get("request_id") == own)
    assert line["client_request_id"] is None and long_id not in str(daemon.log_lines)


def test_with_keys_a_foreign_host_is_let_through_but_a_foreign_origin_is_refused(daemon: Daemon) -> None:
    # The key authenticates (a DNS-rebinding page has none): any Host; a browser's Origin is checked always.
    renamed = httpx.get(f"{daemon.url}/v1/models", headers={**AUTH, "Host": "llm.example.net:8000"})
    assert renamed.status_code == 200
    foreign = httpx.get(f"{daemon.url}/v1/models", headers={**AUTH, "Origin": "https://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "origin_not_allowed"


def test_beyond_limit_concurrency_a_request_gets_503() -> None:
    # uvicorn counts the asking connection too: a limit of 3 serves 2 connections at once
    d = start_daemon("--api-key", API_KEY, "--n-parallel", "1", "--limit-concurrency", "3")
    try:
        with httpx.Client(base_url=d.url) as first, httpx.Client(base_url=d.url) as second:
            # two keep-alive connections, open once each has had its answer
            assert first.get("/health").status_code == second.get("/health").status_code == 200
            third = httpx.get(f"{d.url}/health")
            assert third.status_code == 503
        assert httpx.get(f"{d.url}/health").status_code == 200  # freed: served again
    finally:
        d.stop()


# -- model-free ------------------------------------------------------------------------------


@pytest.mark.pure
def test_serve_has_the_transport_options_with_the_config_defaults_and_checks_them() -> None:
    params = {p.name: p for p in serve.params}
    defaults = Config()
    for name in options.TRANSPORT_FIELDS:
        assert params[name].default == getattr(defaults, name), name
    assert Config(allowed_origins=("https://a.example, https://b.example",)).allowed_origins == (
        "https://a.example", "https://b.example")
    with pytest.raises(InvalidRequestError, match="body_timeout_s"):
        Config(body_timeout_s=0)
    result = CliRunner().invoke(serve, ["--limit-concurrency", "0"])
    assert result.exit_code == 1 and "limit_concurrency must be >= 1" in result.output


@pytest.mark.pure
@pytest.mark.parametrize(("raw", "kept"), [
    (b"abc-123", "abc-123"), (b"x" * 128, "x" * 128), (b"x" * 129, None), (b"two words", None),
    (b"line\nbreak", None), ("caf\u00e9".encode("latin-1"), None), (b"", None)])
def test_a_client_request_id_is_kept_only_when_short_printable_ascii(raw: bytes, kept: str | None) -> None:
    assert client_request_id({"headers": [(b"x-request-id", raw)]}) == kept


@pytest.mark.pure
def test_a_route_label_is_the_template_and_an_unknown_path_shares_one() -> None:
    state = ServerState(["m"], None, 1 << 20)
    create_app(state)
    label = state.metrics.routes.label
    assert label("/files/file-abc") == "/files/{file_id}" and label("/api/tags") == "/api/tags"
    assert label("/v1/files/file-abc") == "/v1/files/{file_id}"
    assert label("/v1/files/file-abc/content") == "/v1/files/{file_id}/content"
    assert label("/no/such/" + uuid.uuid4().hex) == label("/x" * 50) == UNMATCHED
