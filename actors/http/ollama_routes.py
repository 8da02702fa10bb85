"""The Ollama dialect's generating routes: ``/api/chat``, ``/api/generate``, ``/api/embed``,
``/api/embeddings`` and ``/api/rerank`` (the Jina-shaped rerank proposed for Ollama) (uvicorn's
event loop). What a body means is ``llamactor.dialects.ollama`` (``/api/rerank``'s: ``dialects.rerank``).

Ollama's model lifecycle comes with them: an empty request loads the model (or, with
``keep_alive`` 0, unloads it) and answers one object; ``keep_alive`` 0 on a request unloads the
model once the answer is sent; ``load_duration`` says how long loading took. Unknown body fields
are accepted and ignored (as Go's JSON does); options llamactor cannot apply per request are
named in one warning (``ollama_options_not_applied``).
"""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from llamactor.base.errors import BatcherUnavailableError, InvalidRequestError, ModelNotFoundError, PermissionDeniedError
from llamactor.base.logging import get_logger
from llamactor.dialects.ollama import embed as ollama_embed
from llamactor.dialects.ollama.call import DIALECT, OllamaCall, chat_call, generate_call
from llamactor.dialects.ollama.models import tagged
from llamactor.dialects.ollama.replies import answer_lines, loaded_reply, stream_error, whole_answer
from llamactor.dialects.ollama.schema import (ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest,
                                              ModelRequest, keep_alive_s)
from llamactor.dialects.rerank.call import rerank_call
from llamactor.dialects.rerank.replies import ollama_reply
from llamactor.dialects.rerank.schema import OllamaRerankBody
from llamactor.handles.model import ModelClient
from llamactor.http.framing import NDJSON
from llamactor.http.request_path import Planned, answer, context, embed, load, stream
from llamactor.http.rerank_routes import reranked
from llamactor.http.state import ServerState, State, tenant_of

log = get_logger("llamactor.http")
UNLOAD_DRAIN_S = 30.0  # keep_alive 0: requests in flight on the model get this long to finish
router = APIRouter()


def lookup(state: ServerState, name: str) -> ModelClient:
    """The model ``name`` names, not loaded (Ollama's 404 text if none)."""
    if not name:
        raise InvalidRequestError("model is required")
    if state.router is None or state.draining:
        raise BatcherUnavailableError("the server is starting or shutting down")
    try:
        return state.model(state.router, name)
    except ModelNotFoundError:
        served = ", ".join(tagged(n) for n in state.model_names)
        raise ModelNotFoundError(f"model '{name}' not found (this server serves {served})") from None


async def loaded(state: ServerState, request: Request,
                 body: ModelRequest | EmbedRequest | EmbeddingsRequest) -> tuple[ModelClient, int]:
    """The model, loaded; with the nanoseconds that took (Ollama's load_duration)."""
    if keep_alive_s(body.keep_alive) == 0:  # (a bad duration: 400 before anything happens)
        may_unload(state, request)  # the answer will unload it
    llm = lookup(state, body.model)
    started = time.perf_counter()
    await load(llm, request)
    ignored, unknown = body.options.not_applied()
    if ignored or unknown:
        log.warning("ollama_options_not_applied", model=llm.name, ignored=ignored, unknown=unknown,
                    why="llamactor cannot apply these per request (num_ctx and the like are fixed at load)")
    if body.model_extra:  # Ollama (Go's JSON) ignores unknown fields; clients send their own extras
        log.debug("ollama_fields_ignored", model=llm.name, fields=sorted(body.model_extra))
    return llm, int((time.perf_counter() - started) * 1e9)


async def unload(llm: ModelClient) -> None:
    drop = getattr(llm, "unload", None)  # in-process Replicas; Ray Serve's replicas are not unloaded per request
    if drop is None:
        log.warning("ollama_keep_alive_ignored", model=llm.name, why="models served by Ray Serve are not unloaded")
        return
    await asyncio.to_thread(drop, UNLOAD_DRAIN_S)


def unload_after(keep_alive: float | str | None, llm: ModelClient) -> BackgroundTask | None:
    """keep_alive 0: the model is unloaded once the answer is sent."""
    return BackgroundTask(unload, llm) if keep_alive_s(keep_alive) == 0 else None


def may_unload(state: ServerState, request: Request) -> None:
    """With tenants' keys, unloading a model (``keep_alive`` 0) is for admins: it stops everyone's work."""
    tenant = tenant_of(request)
    if state.tenant_keys and not tenant.admin:
        raise PermissionDeniedError("unloading a model (keep_alive 0) is for admin keys")


async def load_or_unload(state: ServerState, request: Request, body: ModelRequest, kind: str) -> JSONResponse:
    """An empty prompt: load the model, or unload it (keep_alive 0); one object, even when streamed."""
    if keep_alive_s(body.keep_alive) == 0:
        may_unload(state, request)
        await unload(lookup(state, body.model))
        return JSONResponse(loaded_reply(body.model, kind, "unload"))
    await loaded(state, request, body)
    return JSONResponse(loaded_reply(body.model, kind, "load"))


async def reply(request: Request, state: ServerState, body: ModelRequest, ollama_call: OllamaCall | None,
                kind: str) -> Response:
    """Stream (a refusal is a 4xx before the 200), or answer whole; no call (nothing to say):
    load or unload the model."""
    if ollama_call is None:
        return await load_or_unload(state, request, body, kind)
    llm, load_ns = await loaded(state, request, body)
    call = Planned.of(state, request, llm, ollama_call, DIALECT)
    after = unload_after(body.keep_alive, llm)
    if ollama_call.streamed:
        return await stream(request, call, lambda p, updates: answer_lines(p, updates, load_ns), NDJSON,
                            stream_error, after)
    [c] = await answer(request, call)
    return JSONResponse(whole_answer(ollama_call, c, load_ns), background=after)


@router.post("/api/chat", response_model=None)
async def chat(body: ChatRequest, request: Request, state: State) -> Response:
    llm = lookup(state, body.model)
    ollama_call = chat_call(body, context(request, llm, body.model), llm.config.n_ctx)  # a bad body: 400 before the model loads
    if ollama_call is not None and ollama_call.request.tools is not None and not llm.loaded:
        await load(llm, request)
        ollama_call = chat_call(body, context(request, llm, body.model), llm.config.n_ctx)  # in the model's own tool-call format
    return await reply(request, state, body, ollama_call, "chat")


@router.post("/api/generate", response_model=None)
async def generate(body: GenerateRequest, request: Request, state: State) -> Response:
    llm = lookup(state, body.model)
    ollama_call = generate_call(body, context(request, llm, body.model), llm.config.n_ctx)
    return await reply(request, state, body, ollama_call, "generate")


@router.post("/api/embed", response_model=None)
async def embed_route(body: EmbedRequest, request: Request, state: State) -> JSONResponse:
    llm, load_ns = await loaded(state, request, body)
    embedding = ollama_embed.embed_request(body, context(request, llm))
    result = await embed(state, request, llm, embedding) if embedding is not None else None
    return JSONResponse(ollama_embed.embed_reply(body, result, load_ns), background=unload_after(body.keep_alive, llm))


@router.post("/api/embeddings", response_model=None)
async def embeddings(body: EmbeddingsRequest, request: Request, state: State) -> JSONResponse:
    """The legacy route: one prompt, one vector, not normalized."""
    llm, _ = await loaded(state, request, body)
    embedding = ollama_embed.embeddings_request(body, context(request, llm))
    result = await embed(state, request, llm, embedding) if embedding is not None else None
    return JSONResponse(ollama_embed.embeddings_reply(result), background=unload_after(body.keep_alive, llm))



@router.post("/api/rerank", response_model=None)
async def rerank(body: OllamaRerankBody, request: Request, state: State) -> JSONResponse:
    if keep_alive_s(body.keep_alive) == 0:
        may_unload(state, request)
    llm = lookup(state, body.model or "")
    call = rerank_call(body, llm.config.max_rerank_documents)  # a bad body: 400 before the model loads
    ctx = context(request, llm, body.model)
    [done] = await reranked(state, request, await load(llm, request), [call], ctx, "ollama")
    return JSONResponse(ollama_reply(call, done, body.model or ""), background=unload_after(body.keep_alive, llm))
