"""A property-based fuzz of every route of the daemon, generated from the app's own OpenAPI schema
by schemathesis, against a real ``llamactor serve --keys`` on the real model: whatever body,
query or path a caller sends (schema-valid or not), no route answers a 5xx, the batcher never
restarts, and the daemon is healthy afterwards.

Tenant routes are called with a tenant's key, the admin routes (``/metrics``, ``/engine/events``,
``/models/load``, ``/models/unload``) with an admin's. The budget is bounded and deterministic:
a fixed seed, a fixed number of examples per operation (``LLAMACTOR_FUZZ_EXAMPLES`` raises it for
a deeper run by hand), no shrinking (a failure names the case as generated) and no example
database; the routes served twice (under ``/v1`` and at the root) are fuzzed once, under ``/v1``.
Generation stays cheap: a small context, and every generating body decodes at most
``MAX_TOKENS`` tokens (``bound_generation``: how many tokens a caller may ask for is checked by the
dialects; decoding hundreds of them here would only spend the budget).
"""

from __future__ import annotations

import copy
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig

from llamactor.http.ollama_model_routes import UNSUPPORTED
from llamactor.http.server import BOTH_PREFIXES, create_app

from tests.support.daemon import MODEL_ID, Daemon, start_daemon
from tests.support.keys import write_keys_file

TENANT_KEY, ADMIN_KEY = "sk-fuzz-tenant-0001", "sk-fuzz-admin-00001"
KEY_TABLES = {TENANT_KEY: {"tenant": "fuzzer"}, ADMIN_KEY: {"tenant": "ops", "admin": True}}
ADMIN_PATHS = ("/metrics", "/engine/events", "/models/load", "/models/unload")
EXAMPLES = int(os.environ.get("LLAMACTOR_FUZZ_EXAMPLES", "8"))
MAX_TOKENS = 4  # what a generated request may decode at most
# Where each generating route takes the number of tokens to decode (the first is set when none
# is given: OpenAI's and Ollama's defaults run to the end of the context). Ollama's go in "options".
TOKEN_FIELDS = {"/v1/completions": ("max_tokens", "n_predict"),
                "/v1/chat/completions": ("max_completion_tokens", "max_tokens", "n_predict"),
                "/v1/responses": ("max_output_tokens",), "/v1/messages": ("max_tokens",),
                "/api/chat": ("num_predict",), "/api/generate": ("num_predict",)}
SEED = 36
REQUEST_TIMEOUT_S = 60  # a shared CI box can be slow: a 4-token answer took 10 s at a load of 12 on 2 cores
RESTART_EVENTS = ("batcher_failed", "batcher_restarting", "supervisor_gave_up")


def _schema_of_the_app() -> dict[str, Any]:
    """The daemon's OpenAPI document: the app's routes and body models do not depend on its state."""
    with warnings.catch_warnings():  # FastAPI names a route's GET and HEAD alike ("Duplicate Operation ID")
        warnings.simplefilter("ignore", UserWarning)
        # only what create_app reads while it wires the app (the middleware reads the rest per request)
        state = SimpleNamespace(max_body_bytes=1 << 20, metrics=SimpleNamespace(), origins=None,
                                transport=SimpleNamespace(body_timeout_s=60.0), keys=SimpleNamespace(required=True))
        return create_app(state).openapi()  # type: ignore[arg-type]


def _twice_served_root_paths(document: dict[str, Any]) -> str:
    """A regex of the root copies of the routes also served under /v1 (the same handlers)."""
    routes = {route.path for router in BOTH_PREFIXES for route in router.routes}  # type: ignore[attr-defined]
    roots = sorted(p for p in document["paths"] if p in routes and "/v1" + p in document["paths"])
    return "^(" + "|".join(re.escape(p) for p in roots) + ")$"


DOCUMENT = _schema_of_the_app()
CONFIG = SchemathesisConfig.from_dict({
    "seed": SEED,
    "generation": {"mode": "all", "max-examples": EXAMPLES, "deterministic": True, "no-shrink": True,
                   "database": "none"},
    "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
    "max-stream-events": 1,  # /engine/events never ends: its first event, then the stream is closed
})
# (a copy: schemathesis resolves the document's references in place)
SCHEMA = (schemathesis.openapi.from_dict(copy.deepcopy(DOCUMENT), config=CONFIG)
          .exclude(path_regex=_twice_served_root_paths(DOCUMENT))
          # its route names a {digest} its handler (a 501: llamactor has no blobs) never declares
          .exclude(path="/api/blobs/{digest}"))


def key_for(path: str) -> str:
    return ADMIN_KEY if path in ADMIN_PATHS else TENANT_KEY


def bound_generation(path: str, body: Any) -> None:
    """Make a generating body decode at most ``MAX_TOKENS`` tokens: a larger (or, for Ollama, a
    negative: "until the context is full") count is lowered, a missing one set. A body of the
    wrong shape is left alone: the route refuses it."""
    fields = TOKEN_FIELDS.get(path, ())
    part = body
    if fields == ("num_predict",) and isinstance(body, dict):
        part = body["options"] = {} if body.get("options") is None else body["options"]
    if not fields or not isinstance(part, dict):
        return
    counts = {name: part[name] for name in fields  # 5.0 is an integer to pydantic too
              if isinstance(part.get(name), (int, float)) and not isinstance(part[name], bool)}
    for name, value in counts.items():
        if value > MAX_TOKENS or (name == "num_predict" and value < 0):
            part[name] = MAX_TOKENS
    if not counts and all(part.get(name) is None for name in fields):
        part[fields[0]] = MAX_TOKENS


def batcher_restarts(daemon: Daemon) -> float:
    """The supervisors' restart counters, summed over every model and replica (/metrics)."""
    text = httpx.get(f"{daemon.url}/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30).text
    return sum(float(v) for v in re.findall(r"^llamactor_batcher_restarts_total\{[^}]*\} (\S+)$", text, re.M))


def health(daemon: Daemon) -> httpx.Response:
    return httpx.get(f"{daemon.url}/health", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)


def tail_of_log(daemon: Daemon, since: int) -> list[dict]:
    """The daemon's log lines since ``since`` that tell of a failure (what a finding quotes)."""
    return [line for line in daemon.log_lines[since:]
            if line.get("level") in ("error", "warning", "critical") or line.get("event") == "raw"]


class FuzzedDaemon:
    """The daemon under fuzz. One that a case left unhealthy (a crash loop that spent the restart
    budget) is replaced, so that the cases after it still tell something; the first such case
    has failed already, and the final check fails on the restarts it counted."""

    def __init__(self, keys_file: Path) -> None:
        self.keys_file = keys_file
        self.restarts_seen = 0.0
        self.replaced: list[str] = []
        self.daemon = self._start()

    def _start(self) -> Daemon:
        return start_daemon("--keys", str(self.keys_file), "--n-ctx", "1024", "--n-parallel", "4")

    def ensure_healthy(self, why: str) -> Daemon:
        if self.daemon.process.poll() is None and health(self.daemon).status_code == 200:
            return self.daemon
        self.replaced.append(why)
        self.stop()
        self.daemon = self._start()
        return self.daemon

    def stop(self) -> None:
        if self.daemon.process.poll() is None:
            self.restarts_seen += batcher_restarts(self.daemon)
        self.daemon.stop()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzedDaemon]:
    keys = write_keys_file(tmp_path_factory.mktemp("keys"), KEY_TABLES)
    box = FuzzedDaemon(keys)
    yield box
    box.stop()


def _requests_of(document: dict[str, Any]) -> dict[str, Any]:
    """What a document says a request may be: each operation's parameters and body, and the
    models they name (not operation ids: FastAPI names a route's GET and HEAD from a set, whose
    order varies from one process to the next)."""
    return {"operations": {(path, method): (op.get("parameters"), op.get("requestBody"))
                           for path, ops in document["paths"].items() for method, op in ops.items()},
            "models": document["components"]["schemas"]}


def test_the_fuzzed_schema_is_the_daemons_own(fuzzed: FuzzedDaemon) -> None:
    served = httpx.get(f"{fuzzed.daemon.url}/openapi.json", headers={"Authorization": f"Bearer {TENANT_KEY}"})
    assert _requests_of(served.json()) == _requests_of(DOCUMENT)


@pytest.mark.timeout(300)  # all the examples of one operation
@SCHEMA.parametrize()
def test_no_generated_request_gets_a_5xx_or_restarts_the_batcher(case: Any, fuzzed: FuzzedDaemon) -> None:
    daemon = fuzzed.ensure_healthy(f"before {case.method} {case.formatted_path}")
    since = len(daemon.log_lines)
    bound_generation(case.path, case.body)
    headers = {"Authorization": f"Bearer {key_for(case.path)}"}
    response = case.call(base_url=daemon.url, headers=headers, timeout=REQUEST_TIMEOUT_S)
    if not (case.path in UNSUPPORTED and response.status_code == 501):  # Ollama's routes llamactor has not
        case.validate_response(response, checks=[not_a_server_error], headers=headers)
    restarted = [line for line in daemon.log_lines[since:] if line.get("event") in RESTART_EVENTS]
    assert not restarted, f"the batcher restarted: {tail_of_log(daemon, since)[-6:]}"


def test_the_daemon_is_healthy_after_the_fuzz_and_never_restarted_its_batcher(fuzzed: FuzzedDaemon) -> None:
    daemon = fuzzed.daemon
    assert health(daemon).json()["status"] == "ready"
    answer = daemon.client(TENANT_KEY).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Say hi."}], max_tokens=2, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert fuzzed.replaced == [] and fuzzed.restarts_seen + batcher_restarts(daemon) == 0
