"""The OpenAI-compatible HTTP app (FastAPI). Thin: each request goes to its model's handle.

Handlers run on uvicorn's event loop and only await futures from the actor trees. Errors become
OpenAI-style JSON with the status of the error class (400, 401, 404, 413, 429 + Retry-After, 503);
anything unexpected is a 500 with no stack trace. A client that disconnects cancels its request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from openai.types import Completion as OACompletion
from openai.types.chat import ChatCompletion

import llamactor
from llamactor.base.logging import get_logger
from llamactor.base.errors import BatcherUnavailableError, LlamactorError
from llamactor.http.body_limit import BodyLimitMiddleware
from llamactor.http.embeddings import EmbeddingRequest, create_embeddings
from llamactor.http.metrics import Metrics
from llamactor.http.openai_schema import (
    FINISH_REASON,
    ChatRequest,
    CompletionRequest,
    best_of,
    chat_logprobs,
    chat_message,
    completion_logprobs,
    error_body,
)
from llamactor.http.sse import chat_chunks, completion_chunks, sse_response, usage
from llamactor.handles.model import ModelClient, ModelRouter
from llamactor.handles.streams import AsyncTextStream

log = get_logger("llamactor.http")


class ServerState:
    """What the app needs: the router once built, the model names, the API key, the drain flag.

    ``router`` is a ``llamactor.Router`` (under Ray Serve, ``llamactor.rayserve``'s
    ``RemoteRouter``): ``model(name)`` gives a ``ModelClient``."""

    def __init__(self, model_names: list[str], api_key: str | None, max_body_bytes: int) -> None:
        self.router: ModelRouter | None = None
        self.model_names = list(model_names)
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.draining = False
        self.metrics = Metrics(self.replica_stats)

    def replica_stats(self) -> list[tuple[str, int, dict[str, Any]]]:
        """(model, replica, stats) of every replica of every model, as last published (in-process
        this never waits for an actor; under Ray Serve it asks the replicas)."""
        router = self.router
        if router is None:
            return []
        return [(name, i, s) for name in self.model_names for i, s in enumerate(router.model(name).replica_stats())]


def model_status(replica_states: set[str]) -> str:
    """A model's health from its replicas': ``degraded`` while some restart and others serve."""
    if replica_states <= {"unloaded"}:
        return "unloaded"
    if replica_states == {"ready"}:
        return "ready"
    return "degraded" if "ready" in replica_states else sorted(replica_states - {"unloaded"})[0]


def _error(status: int, message: str, type_: str, code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code), status_code=status, headers=headers)


def _from_exception(e: LlamactorError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.http_status == 429 else None
    status = e.http_status if e.http_status < 500 or e.http_status == 503 else 500
    return _error(status, str(e), e.code, e.code, headers)


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
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}" if where else "invalid JSON body",
                      "invalid_request_error", "invalid_request_error")

    @app.exception_handler(LlamactorError)
    async def llamactor_error(_request: Request, exc: LlamactorError) -> JSONResponse:
        return _from_exception(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # 404 (no such path), 405 (wrong method): OpenAI's error shape, not FastAPI's {"detail": ...}
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, str(exc.detail), type_, headers=dict(exc.headers or {}) or None)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.error("http_unexpected_error", error=repr(exc))
        return _error(500, "internal server error", "server_error")

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

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        router = state.router
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "llamactor",
             "loaded": bool(router is not None and router.model(name).loaded)} for name in state.model_names]}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        llm = await _ready_model(state, body.model)
        body.check()
        rid = f"cmpl-{request.state.request_id}"
        # A batch of prompts: choice index = prompt_index * n + choice, as OpenAI numbers them; the
        # n choices of each prompt go out together (one replica, the prompt computed once).
        prompts, n, n_gen = body.prompts(), body.n, body.n_generated
        sampling = body.sampling()
        if body.stream:
            streams = await _all_queued([functools.partial(llm.stream_n_async, prompt, n, **sampling,
                                                           request_id=_prompt_id(rid, p, len(prompts)))
                                         for p, prompt in enumerate(prompts)])
            echoed = [str(prompts[k // n]) for k in range(len(streams))] if body.echo else None
            return sse_response(completion_chunks(streams, lambda: _envelope(rid, "text_completion", llm.name),
                                                  state.metrics.observer(llm.name), body.logprobs, echoed))
        generated = await _complete(request, state.metrics.observer(llm.name), lambda: [
            f for p, prompt in enumerate(prompts)
            for f in llm.submit_n(prompt, n_gen, request_id=_prompt_id(rid, p, len(prompts)), **sampling)])
        done = [c for p in range(len(prompts)) for c in (
            best_of(generated[p * n_gen:(p + 1) * n_gen], n) if n_gen > n else generated[p * n_gen:(p + 1) * n_gen])]
        echoed = [str(prompts[i // n]) if body.echo else "" for i in range(len(done))]
        return OACompletion.model_validate({
            **_envelope(rid, "text_completion", llm.name),
            "choices": [{"index": i, "text": echoed[i] + c.text, "finish_reason": FINISH_REASON[c.finish_reason],
                         "logprobs": completion_logprobs(c.logprobs, body.logprobs) if body.logprobs is not None else None}
                        for i, c in enumerate(done)],
            "usage": usage(generated)}).model_dump(exclude_none=True)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatRequest, request: Request) -> Any:
        llm = await _ready_model(state, body.model)
        body.check()
        rid = f"chatcmpl-{request.state.request_id}"
        messages = body.message_dicts()
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            streams = await _all_queued([functools.partial(llm.stream_chat_n_async, messages, body.n,
                                                           request_id=rid, **body.sampling())])
            return sse_response(chat_chunks(streams, lambda: _envelope(rid, "chat.completion.chunk", llm.name),
                                            state.metrics.observer(llm.name), include_usage, body.logprobs, body.parsed_tools))
        done = await _complete(request, state.metrics.observer(llm.name), lambda: llm.submit_chat_n(
            messages, body.n, request_id=rid, **body.sampling()))
        return ChatCompletion.model_validate({
            **_envelope(rid, "chat.completion", llm.name),
            "choices": [{"index": i, "message": chat_message(c),
                         "finish_reason": FINISH_REASON[c.finish_reason], "logprobs": chat_logprobs(c.logprobs)}
                        for i, c in enumerate(done)],
            "usage": usage(done)}).model_dump(exclude_none=True)

    @app.post("/v1/embeddings", response_model=None)
    async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
        llm = await _ready_model(state, body.model)
        return await create_embeddings(llm, body, f"embd-{request.state.request_id}", llm.name)

    app.add_middleware(BodyLimitMiddleware, max_body_bytes=state.max_body_bytes)  # outermost: runs first
    return app


async def _guard(request: Request, state: ServerState) -> Response | None:
    """Refuse before routing: a missing or wrong API key (401). Body size: ``BodyLimitMiddleware``."""
    if state.api_key and request.url.path.startswith("/v1/"):
        if request.headers.get("authorization", "") != f"Bearer {state.api_key}":
            return _error(401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error",
                          "invalid_api_key")
    return None


async def _ready_model(state: ServerState, model: str | None) -> ModelClient:
    """The model the request names (404 if none), loaded (off the event loop) if it was not."""
    if state.router is None or state.draining:
        raise BatcherUnavailableError("the server is starting or shutting down")
    handle = state.router.model(model)  # ModelNotFoundError: 404
    if not handle.loaded:
        await asyncio.to_thread(handle.load)
    return handle


def _envelope(rid: str, kind: str, model: str) -> dict[str, Any]:
    """The fields every completion object and chunk starts with."""
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


async def _complete(request: Request, observe: Callable[[llamactor.Completion], None],
                    submit: Callable[[], list[Any]]) -> list[llamactor.Completion]:
    """Submit the choices, await them (cancelling on disconnect), count them in the metrics."""
    done = await _gather(request, submit())
    for c in done:
        observe(c)
    return done


def _prompt_id(rid: str, index: int, n_prompts: int) -> str:
    """The llamactor request id of one prompt of a batch: the HTTP id itself, or ``-p<index>``."""
    return rid if n_prompts == 1 else f"{rid}-p{index}"


async def _all_queued(starts: list[Callable[[], list[AsyncTextStream]]]) -> list[AsyncTextStream]:
    """Start the streams; before the 200: every choice accepted by the batcher, or the first
    refusal raised (its 4xx, as without ``stream``) and the other choices cancelled."""
    streams: list[AsyncTextStream] = []
    try:
        for start in starts:
            streams += start()
        await asyncio.gather(*(s.queued() for s in streams))
    except BaseException:
        for s in streams:
            s.cancel()
        raise
    return streams


async def _gather(request: Request, futures: list[Any]) -> list[llamactor.Completion]:
    """Await the completions; if the client disconnects first, cancel them."""
    work: asyncio.Future[Any] = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    disconnect: asyncio.Future[Any] = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            for f in futures:
                f.cancel()
            work.cancel()
            with contextlib.suppress(BaseException):  # collect the gather's CancelledError: nobody else will
                await work
            raise llamactor.CancelledError("the client disconnected")
        if work.exception() is not None:  # one choice refused or failed: the others are not wanted
            for f in futures:
                f.cancel()
        return work.result()  # type: ignore[no-any-return]
    finally:
        disconnect.cancel()


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
