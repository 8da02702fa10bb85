"""The HTTP app (FastAPI): transport only. Middleware (``middleware``: ids, logging, the request
counter, the API key, JSON bodies; ``origins``: Host, Origin, CORS; ``body_limit``: size and time), the exception handlers (``errors``: each
dialect's error shape), and one ``APIRouter`` per dialect, whose module-level handlers turn a
body into typed requests and back through ``llamactor.dialects`` over the common request path
(``request_path``) and the one stream framing (``framing``).

Handlers run on uvicorn's event loop and only await futures from the actor trees. A client that
disconnects cancels its request.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute

from llamactor.base.errors import LlamactorError
from llamactor.handles import tracing
from llamactor.http import (anthropic_routes, batches_routes, engine_routes, errors, files_routes, model_admin_routes,
                            ollama_model_routes, ollama_routes, openai_routes, ops_routes, rerank_routes,
                            responses_routes, tokenizer_routes, ui_routes)
from llamactor.http.body_limit import BodyLimitMiddleware, Receive, Scope, Send
from llamactor.http.framing import SERVER_SEND
from llamactor.http.metrics import RouteTemplates
from llamactor.http.middleware import JsonBodies, KeyGuard, RequestLog, is_json_or_upload
from llamactor.http.origins import OriginGuard, PolicyCors
from llamactor.http.state import ServerState
from llamactor.http.tracing import TraceRequests

# Served twice: under /v1 and at the root (llama-server's routes: an openai client whose
# base_url lacks /v1 calls those).
BOTH_PREFIXES = (openai_routes.router, responses_routes.router, tokenizer_routes.router, files_routes.router,
                 batches_routes.router)


def _templates(routes: Iterable[BaseRoute], prefix: str = "") -> list[str]:
    """The path templates of ``routes`` under ``prefix`` (the request counter's labels)."""
    return [prefix + path for route in routes if isinstance(path := getattr(route, "path", None), str)]


class App(FastAPI):
    """The app: FastAPI, with the server's own ``send`` in each HTTP request's scope
    (``framing.SERVER_SEND``), where a streamed response's body chunks go past the middleware.
    Middleware added here may read and change a response's start, never its body."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # event loop
        if scope["type"] == "http":
            scope[SERVER_SEND] = send
        await super().__call__(scope, receive, send)


def create_app(state: ServerState) -> FastAPI:
    app = App(title="llamactor", docs_url=None, redoc_url=None, strict_content_type=False)
    app.state.server = state
    app.add_exception_handler(RequestValidationError, errors.invalid_body)  # type: ignore[arg-type]
    app.add_exception_handler(LlamactorError, errors.llamactor_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, errors.http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, errors.unexpected)
    included = [(ops_routes.router, ""), (model_admin_routes.router, ""),  # /models/load, /models/unload: the root only
                (engine_routes.router, ""), (ui_routes.router, "")]  # the live view of the engine, and its pages
    included += [(router, prefix) for router in BOTH_PREFIXES for prefix in ("/v1", "")]
    included += [(router, "") for router in (anthropic_routes.router, ollama_routes.router, ollama_model_routes.router,
                                              rerank_routes.router)]  # its paths name their own /v1, /v2
    for router, prefix in included:
        app.include_router(router, prefix=prefix)
    state.metrics.routes = RouteTemplates(_templates(app.routes) + [t for router, prefix in included
                                                                    for t in _templates(router.routes, prefix)])
    # Added innermost first; each check that needs only the headers runs before the body is read.
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=state.max_body_bytes,
                       body_timeout_s=state.transport.body_timeout_s)
    app.add_middleware(KeyGuard, state=state)
    app.add_middleware(PolicyCors, policy=state.origins)  # preflights need no key
    app.add_middleware(OriginGuard, policy=state.origins, keyless=lambda: not state.keys.required,
                       is_json=is_json_or_upload)
    app.add_middleware(RequestLog, state=state)  # sees and logs every answer
    if (tracer := tracing.active()) is not None:  # outermost: its span covers every refusal too
        app.add_middleware(TraceRequests, tracer=tracer, route_of=state.metrics.routes.label)
    return app
