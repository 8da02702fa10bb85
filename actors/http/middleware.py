"""The app's middleware (uvicorn's event loop): the API key and the tenant it names, the request
id and log line, the request counter, and JSON bodies whatever their Content-Type. Body size:
``body_limit``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from email.message import Message

from fastapi import Request
from fastapi.responses import Response

from llamactor.base.logging import get_logger
from llamactor.dialects.errors import ErrorInfo
from llamactor.http.body_limit import ASGIApp, Receive, Scope, Send
from llamactor.http.errors import error_response
from llamactor.base.tenants import Tenant
from llamactor.http.state import ServerState

log = get_logger("llamactor.http")
# answered without the API key: probes, and "/" (Ollama's heartbeat: "Ollama is running"); /health
# says more to an admin. /metrics too, unless tenants' keys are configured (then: admins only).
OPEN_PATHS = ("/health", "/")
SCRAPED_PATH = "/metrics"
# the web pages (static: they hold no data, what they fetch asks for the key), and the live view of
# the engine, which once keys exist (--api-key or --keys) is for admin keys
UI_PREFIX = "/ui"
ENGINE_PATH = "/engine/events"


async def guard_and_log(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Refuse a missing or wrong key before routing; give the request its id and tenant; count
    and log it. Our own id is always unique (it keys the request inside the actors); a client's
    X-Request-Id is echoed back and logged beside it, never trusted to be unique."""
    state: ServerState = request.app.state.server
    start = time.perf_counter()
    rid = uuid.uuid4().hex[:16]
    client_rid = request.headers.get("x-request-id")
    request.state.request_id = rid
    tenant = request.state.tenant = find_tenant(request, state)
    response = refuse(request, state, tenant) or await call_next(request)
    response.headers["x-request-id"] = client_rid or rid
    if (limits := getattr(request.state, "rate_limits", None)) is not None:  # what the tenant has left
        response.headers.update(limits.headers())
    state.metrics.requests.labels(request.url.path, str(response.status_code)).inc()
    if response.status_code == 429 and tenant is not None:
        state.metrics.tenant_refused.labels(tenant.name).inc()
    log.info("http_request", method=request.method, path=request.url.path, status=response.status_code,
             request_id=rid, client_request_id=client_rid, tenant=tenant.name if tenant else None,
             ms=round((time.perf_counter() - start) * 1000, 1))
    return response


def find_tenant(request: Request, state: ServerState) -> Tenant | None:
    """The tenant of the key given as ``Authorization: Bearer`` (OpenAI, Ollama clients) or
    ``x-api-key`` (Anthropic's), None if neither names one. Both are looked up, every key
    compared in constant time (``KeyTable``); a key is never logged."""
    bearer = request.headers.get("authorization", "")
    by_bearer = state.keys.find(bearer[7:] if bearer[:7].lower() == "bearer " else None)
    by_header = state.keys.find(request.headers.get("x-api-key"))
    return by_header or by_bearer


def refuse(request: Request, state: ServerState, tenant: Tenant | None) -> Response | None:
    """A 401 for a missing or unknown key; a 403 for a non-admin on an admin's path."""
    path = request.url.path
    page = path == UI_PREFIX or path.startswith(UI_PREFIX + "/")
    if tenant is None and path not in OPEN_PATHS and not page and (path != SCRAPED_PATH or state.tenant_keys):
        return error_response(path, ErrorInfo(401, "missing or wrong API key (Authorization: Bearer ... or "
                                                   "x-api-key)", "authentication_error", "invalid_api_key"))
    if path == SCRAPED_PATH and state.tenant_keys and not (tenant and tenant.admin):
        return error_response(path, ErrorInfo(403, "metrics are for admin keys", "permission_error",
                                              "permission_denied"))
    if path == ENGINE_PATH and state.keys.required and not (tenant and tenant.admin):
        return error_response(path, ErrorInfo(403, "the engine view is for admin keys", "permission_error",
                                              "permission_denied"))
    return None


class JsonBodies:
    """Reads a request body as JSON whatever its Content-Type says, as Ollama, llama-server and
    OpenAI do: LiteLLM's Ollama providers send none, and ``curl -d`` (Ollama's own documented
    examples) sends ``application/x-www-form-urlencoded``. Multipart uploads (the Files API) keep theirs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
            declared = dict(scope.get("headers") or []).get(b"content-type")
            if not _keeps(declared):
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def _keeps(content_type: bytes | None) -> bool:
    """Whether a declared Content-Type is kept: JSON itself, or a multipart form."""
    if not content_type:
        return False
    message = Message()
    message["content-type"] = content_type.decode("latin-1")
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "multipart" or subtype == "json" or subtype.endswith("+json")
