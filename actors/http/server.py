"""The HTTP app (FastAPI): middleware, errors, health and metrics; each dialect's routes come
from its own module (``openai_routes`` ...), all over the same request path.

Handlers run on uvicorn's event loop and only await futures from the actor trees. Errors take
the dialect's own shape (``llamactor.http.errors``) with the status of the error class (400, 401,
404, 413, 429 + Retry-After, 503); anything unexpected is a 500 with no stack trace. A client that
disconnects cancels its request.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from llamactor.base.errors import LlamactorError
from llamactor.base.logging import get_logger
from llamactor.http import (anthropic_routes, batches_routes, files_routes, ollama_routes, openai_routes, responses,
                            tokenizer_routes)
from llamactor.http.body_limit import BodyLimitMiddleware
from llamactor.http.errors import error_response, from_exception
from llamactor.http.state import ServerState, model_status

log = get_logger("llamactor.http")
# answered without the API key: probes, scrapers, and "/" (Ollama's heartbeat: "Ollama is running")
OPEN_PATHS = ("/health", "/metrics", "/")


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="llamactor", docs_url=None, redoc_url=None)
    app.state.server = state

    @app.middleware("http")
    async def guard_and_log(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        start = time.perf_counter()
        # Our own id is always unique (it keys the request inside the actors); a client's
        # X-Request-Id is echoed back and logged beside it, never trusted to be unique.
        rid = uuid.uuid4().hex[:16]
        client_rid = request.headers.get("x-request-id")
        request.state.request_id = rid
        response = await _guard(request, state) or await call_next(request)
        response.headers["x-request-id"] = client_rid or rid
        state.metrics.requests.labels(request.url.path, str(response.status_code)).inc()
        log.info("http_request", method=request.method, path=request.url.path, status=response.status_code,
                 request_id=rid, client_request_id=client_rid, ms=round((time.perf_counter() - start) * 1000, 1))
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = first.get("msg", "invalid request").removeprefix("Value error, ")
        if first.get("type") == "json_invalid" or not first:
            message = "invalid JSON body"
        return error_response(_request.url.path, 400, f"{where}: {message}" if where else message,
                              "invalid_request_error", "invalid_request_error")

    @app.exception_handler(LlamactorError)
    async def llamactor_error(request: Request, exc: LlamactorError) -> JSONResponse:
        return from_exception(request.url.path, exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # 404 (no such path), 405 (wrong method): the dialect's error shape, not FastAPI's {"detail": ...}
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(request.url.path, exc.status_code, str(exc.detail), type_,
                              headers=dict(exc.headers or {}) or None)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("http_unexpected_error", error=repr(exc))
        return error_response(request.url.path, 500, "internal server error", "server_error")

    @app.get("/health")
    async def health() -> JSONResponse:
        # Ready when every loaded replica is (a model that is not loaded loads on its first request).
        # Published stats never wait for an actor; under Ray Serve they are remote calls: off the loop.
        if state.router is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        replicas = await asyncio.to_thread(state.replica_stats)
        models: dict[str, Any] = {name: {"status": "unloaded", "replicas": []} for name in state.model_names}
        for name, i, s in replicas:
            models[name]["replicas"].append({"replica": i, "status": s.get("state"), "running": s.get("running"),
                                             "pending": s.get("pending")})
        for entry in models.values():
            entry["status"] = model_status({r["status"] for r in entry["replicas"]})
        ready = not state.draining and all(m["status"] in ("ready", "degraded", "unloaded") for m in models.values())
        status = "draining" if state.draining else "ready" if ready else "unavailable"
        return JSONResponse({"status": status, "running": sum(r.get("running") or 0 for _, _, r in replicas),
                             "pending": sum(r.get("pending") or 0 for _, _, r in replicas), "models": models},
                            status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        body = await asyncio.to_thread(state.metrics.render)  # under Ray Serve, rendering asks the replicas
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    for dialect in (openai_routes, responses, anthropic_routes, ollama_routes, tokenizer_routes, files_routes,
                    batches_routes):
        dialect.register(app, state)

    app.add_middleware(BodyLimitMiddleware, max_body_bytes=state.max_body_bytes)  # outermost: runs first
    return app




async def _guard(request: Request, state: ServerState) -> Response | None:
    """Refuse before routing: a missing or wrong API key (401), given as ``Authorization: Bearer``
    (OpenAI, Ollama clients) or ``x-api-key`` (Anthropic's). Body size: ``BodyLimitMiddleware``."""
    if state.api_key and request.url.path not in OPEN_PATHS:
        bearer = request.headers.get("authorization", "")
        if bearer != f"Bearer {state.api_key}" and request.headers.get("x-api-key") != state.api_key:
            return error_response(request.url.path, 401, "missing or wrong API key (Authorization: Bearer ... or "
                                  "x-api-key)", "authentication_error", "invalid_api_key")
    return None
