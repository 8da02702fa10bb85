"""The app's middleware (uvicorn's event loop), plain ASGI, outermost first: ``RequestLog`` (the
request id, the log line, the request counter), ``origins.OriginGuard`` (Host, Origin),
``origins.PolicyCors``, ``KeyGuard`` (the API key and the tenant it names), ``body_limit``
(size and time), ``JsonBodies`` (JSON whatever the Content-Type). Every check that needs only
the headers runs before the body is read: an unauthenticated upload gets its 401 at once.
"""

from __future__ import annotations

import re
import time
import uuid
from email import message as email_message

from starlette.datastructures import MutableHeaders

from llamactor.base.logging import get_logger
from llamactor.base.tenants import Tenant
from llamactor.dialects.errors import ErrorInfo
from llamactor.http.body_limit import ASGIApp, Message, Receive, Scope, Send, refuse
from llamactor.http.errors import error_response
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
# A client's X-Request-Id is echoed and logged only if it is short printable ASCII (no spaces):
# anything else could forge log lines or bloat every line and response.
CLIENT_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")


def client_request_id(scope: Scope) -> str | None:
    """The client's ``X-Request-Id`` if it is well-formed, else None (our own id is used)."""
    raw = next((v for k, v in scope.get("headers") or [] if k == b"x-request-id"), None)
    return raw.decode("ascii") if raw is not None and CLIENT_REQUEST_ID.fullmatch(raw) else None


def head_bytes(scope: Scope) -> int:
    """The size of a request's line and headers, about as sent."""
    line = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 16
    return line + sum(len(k) + len(v) + 4 for k, v in scope.get("headers") or [])


class RequestLog:
    """Gives each request its id (``request.state.request_id``: always ours, unique, it keys the
    request inside the actors; a valid client X-Request-Id is echoed back instead and logged
    beside it), and counts and logs it once it has been answered -- refusals included -- labelled
    by its route's template, never by its raw path. A head over ``max_header_bytes`` is a 431
    here: the protocol (``edge_protocol``) refuses a larger head only while it is incomplete, not
    one that came whole in one read."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        rid, client_rid = uuid.uuid4().hex[:16], client_request_id(scope)
        request_state = scope.setdefault("state", {})
        request_state["request_id"] = rid
        status = 500  # unless a response starts: an exception is answered 500 outside this middleware

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                headers["x-request-id"] = client_rid or rid
                if (limits := request_state.get("rate_limits")) is not None:  # what the tenant has left
                    headers.update(limits.headers())
            await send(message)

        try:
            if head_bytes(scope) > self.state.transport.max_header_bytes:
                error = ErrorInfo(431, f"request line and headers over {self.state.transport.max_header_bytes} bytes",
                                  "invalid_request_error", "headers_too_large")
                await refuse(error_response(scope["path"], error), scope, receive, send_with_headers)
            else:
                await self.app(scope, receive, send_with_headers)
        finally:
            self._record(scope, status, rid, client_rid, start)

    def _record(self, scope: Scope, status: int, rid: str, client_rid: str | None, start: float) -> None:
        tenant: Tenant | None = scope["state"].get("tenant")
        self.state.metrics.requests.labels(self.state.metrics.routes.label(scope["path"]), str(status)).inc()
        if status == 429 and tenant is not None:
            self.state.metrics.tenant_refused.labels(tenant.name).inc()
        log.info("http_request", method=scope["method"], path=scope["path"][:200], status=status, request_id=rid,
                 client_request_id=client_rid, tenant=tenant.name if tenant else None,
                 ms=round((time.perf_counter() - start) * 1000, 1))


class KeyGuard:
    """Refuses a missing or wrong key (401), and a non-admin on an admin's path (403), from the
    headers alone: the body of a refused request is never read, its connection closed."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tenant = scope.setdefault("state", {})["tenant"] = find_tenant(scope, self.state)
        if (error := refusal(scope["path"], self.state, tenant)) is not None:
            await refuse(error_response(scope["path"], error), scope, receive, send)
            return
        await self.app(scope, receive, send)


def find_tenant(scope: Scope, state: ServerState) -> Tenant | None:
    """The tenant of the key given as ``Authorization: Bearer`` (OpenAI, Ollama clients) or
    ``x-api-key`` (Anthropic's), None if neither names one. Both are looked up, every key
    compared in constant time (``KeyTable``); a key is never logged."""
    headers = {k: v for k, v in scope.get("headers") or [] if k in (b"authorization", b"x-api-key")}
    bearer = headers.get(b"authorization", b"").decode("latin-1")
    by_bearer = state.keys.find(bearer[7:] if bearer[:7].lower() == "bearer " else None)
    api_key = headers.get(b"x-api-key")
    by_header = state.keys.find(api_key.decode("latin-1") if api_key is not None else None)
    return by_header or by_bearer


def refusal(path: str, state: ServerState, tenant: Tenant | None) -> ErrorInfo | None:
    """A 401 for a missing or unknown key; a 403 for a non-admin on an admin's path."""
    page = path == UI_PREFIX or path.startswith(UI_PREFIX + "/")
    if tenant is None and path not in OPEN_PATHS and not page and (path != SCRAPED_PATH or state.tenant_keys):
        return ErrorInfo(401, "missing or wrong API key (Authorization: Bearer ... or x-api-key)",
                         "authentication_error", "invalid_api_key")
    if path == SCRAPED_PATH and state.tenant_keys and not (tenant and tenant.admin):
        return ErrorInfo(403, "metrics are for admin keys", "permission_error", "permission_denied")
    if path == ENGINE_PATH and state.keys.required and not (tenant and tenant.admin):
        return ErrorInfo(403, "the engine view is for admin keys", "permission_error", "permission_denied")
    return None


class JsonBodies:
    """Reads a request body as JSON whatever its Content-Type says, as Ollama, llama-server and
    OpenAI do: LiteLLM's Ollama providers send none, and ``curl -d`` (Ollama's own documented
    examples) sends ``application/x-www-form-urlencoded``. Multipart uploads (the Files API) keep
    theirs. (A browser must say JSON: ``origins.OriginGuard`` refuses it otherwise.) The scope is
    changed in place: the outer middleware reads the route the router writes into it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
            declared = dict(scope.get("headers") or []).get(b"content-type")
            if not is_json_or_upload(declared):
                scope["headers"] = [*headers, (b"content-type", b"application/json")]
        await self.app(scope, receive, send)


def is_json_or_upload(content_type: bytes | None) -> bool:
    """Whether a declared Content-Type is kept: JSON itself, or a multipart form."""
    if not content_type:
        return False
    message = email_message.Message()
    message["content-type"] = content_type.decode("latin-1")
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "multipart" or subtype == "json" or subtype.endswith("+json")
