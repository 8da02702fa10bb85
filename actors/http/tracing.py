"""``TraceRequests``: the server span of every model route's HTTP request (docs/operations.md,
*Traces*), added to the app only when tracing is on (``llamactor.handles.tracing.active()``).

Plain ASGI, outermost, on uvicorn's event loop. It continues the caller's trace from its W3C
``traceparent`` / ``tracestate`` headers, opens a SERVER span named by the route's template (as
the request counter labels it), makes it the current context and sets the request's dialect
(``trace_spans.DIALECT``) for the handler below: the request spans the handles record
(``RequestTracer.watch``) are its children. When the answer is over -- a stream's last byte
included -- it adds the status and the tenant (``KeyGuard`` wrote it into the scope), and ends. The OpenTelemetry imports are deferred: a daemon
without tracing never loads them. Only headers named here are read: no key, no body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llamactor.base.tenants import Tenant
from llamactor.base.trace_spans import DIALECT, dialect_of
from llamactor.handles.tracing import RequestTracer
from llamactor.http.body_limit import ASGIApp, Message, Receive, Scope, Send

TRACE_HEADERS = (b"traceparent", b"tracestate")


class TraceRequests:
    """``route_of``: a path's route template (``RouteTemplates.label``), the span's name."""

    def __init__(self, app: ASGIApp, tracer: RequestTracer, route_of: Callable[[str], str]) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.app, self.tracer, self.route_of = app, tracer, route_of
        self.propagator = TraceContextTextMapPropagator()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        dialect = dialect_of(scope["path"]) if scope["type"] == "http" else None
        if dialect is None:
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, trace

        headers = scope.get("headers") or []
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in TRACE_HEADERS}
        parent = self.propagator.extract(carrier)
        route = self.route_of(scope["path"])
        span = self.tracer.tracer.start_span(f"{scope['method']} {route}", context=parent, kind=trace.SpanKind.SERVER,
                                             attributes={"http.request.method": scope["method"], "http.route": route,
                                                         "url.path": scope["path"][:200], "llamactor.dialect": dialect})
        attached, dialect_set = context.attach(trace.set_span_in_context(span, parent)), DIALECT.set(dialect)
        status = 500  # unless a response starts: an exception is answered 500 outside this middleware

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            DIALECT.reset(dialect_set)
            context.detach(attached)
            _finish(span, scope, status)


def _finish(span: Any, scope: Scope, status: int) -> None:
    """Add what the answer says to the span, and end it."""
    from opentelemetry import trace

    span.set_attribute("http.response.status_code", status)
    tenant: Tenant | None = scope.get("state", {}).get("tenant")
    if tenant is not None:
        span.set_attribute("llamactor.tenant", tenant.name)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(trace.Status(trace.StatusCode.ERROR))
    span.end()
