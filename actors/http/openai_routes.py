"""The OpenAI dialect's routes: ``/completions``, ``/chat/completions``, ``/embeddings``, ``/models``
and ``/models/{id}`` (LoRA adapters among them), and llama-server's ``/lora-adapters``, served under
``/v1`` and at the root (uvicorn's event loop). What a body
means is ``llamactor.dialects.openai``; the path every handler takes is ``request_path``.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Request

from llamactor.base.errors import ModelNotFoundError
from llamactor.dialects.openai import events, replies
from llamactor.dialects.openai.call import DIALECT, chat_call, completions_call
from llamactor.dialects.openai.embeddings import EmbeddingsBody, embeddings_reply, embeddings_request
from llamactor.dialects.openai.schema import ChatRequest, CompletionRequest
from llamactor.http.framing import OPENAI_SSE
from llamactor.http.request_path import context, embed, find_model, load, planned, respond, warn_ignored
from llamactor.http.state import ServerState, State, tenant_of

router = APIRouter()


@router.post("/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request, state: State) -> Any:
    call = await planned(state, request, body.model, DIALECT, lambda ctx: completions_call(body, ctx))
    warn_ignored(DIALECT, call.plan.ignored, call.plan.id)
    return await respond(request, call, body.stream, events.completion_events, OPENAI_SSE, events.stream_error,
                         replies.completion_reply)


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatRequest, request: Request, state: State) -> Any:
    call = await planned(state, request, body.model, DIALECT, lambda ctx: chat_call(body, ctx))
    warn_ignored(DIALECT, call.plan.ignored, call.plan.id)
    return await respond(request, call, body.stream, events.chat_events, OPENAI_SSE, events.stream_error,
                         replies.chat_reply)


@router.post("/embeddings", response_model=None)
async def embeddings(body: EmbeddingsBody, request: Request, state: State) -> Any:
    llm = find_model(state, body.model)
    ctx = context(request, llm)
    embedding = embeddings_request(body, ctx)
    return embeddings_reply(await embed(state, request, await load(llm, request), embedding), body, ctx)


# The model listings name files on the server's disk (a model's and its adapters' paths) only to
# admins (keyless, every caller is: the local user); a tenant sees the names alone.
@router.get("/models")
async def models(request: Request, state: State) -> dict[str, Any]:
    admin = tenant_of(request).admin
    return {"object": "list", "data": [_model_object(state, name, admin) for name in state.model_names]
            + _adapter_objects(state, admin)}


@router.get("/models/{model_id:path}")
async def model(model_id: str, request: Request, state: State) -> dict[str, Any]:
    admin = tenant_of(request).admin
    if model_id not in state.model_names:
        if adapter := [a for a in _adapter_objects(state, admin) if a["id"] == model_id]:
            return adapter[0]
        raise ModelNotFoundError.among(model_id, state.model_names)
    return _model_object(state, model_id, admin)


@router.get("/lora-adapters")
async def lora_adapters(request: Request, state: State, model: str | None = None) -> list[dict[str, Any]]:
    """llama-server's list of a model's LoRA adapters (``?model=``; default: the first): id (the
    order of ``--lora``), name, path (admins only), and scale 0 -- each is off unless a request asks for it."""
    llm = find_model(state, model)
    admin = tenant_of(request).admin
    entries = [replies.adapter_entry(i, name, path) for i, (name, path) in enumerate(llm.config.loras)]
    return entries if admin else [{k: v for k, v in e.items() if k != "path"} for e in entries]


def _adapter_objects(state: ServerState, admin: bool) -> list[dict[str, Any]]:
    """vLLM's ``/v1/models`` entries of LoRA adapters: each names its model as ``parent``."""
    if state.router is None:
        return []
    # vLLM's ``root`` is an adapter's path: a tenant reads its name there
    return [replies.adapter_object(a, name, path if admin else a) for name in state.model_names
            for a, path in state.router.model(name).config.loras]


def _model_object(state: ServerState, name: str, admin: bool) -> dict[str, Any]:
    router = state.router
    describe = getattr(router, "describe", None)  # the in-process Router (not Ray Serve's ingress)
    fields = describe(name) if describe is not None else None
    if fields is not None and not admin:
        fields = _without_path(fields)
    return replies.model_object(name, bool(router is not None and router.model(name).loaded), fields)


def _without_path(fields: dict[str, Any]) -> dict[str, Any]:
    """A tenant's view of llama-server's router fields: no ``path``, and a failed load's reason
    naming the file alone, not the folders it sits in."""
    path = fields.get("path")
    out = {k: v for k, v in fields.items() if k != "path"}
    status = out.get("status")
    if path and isinstance(status, dict) and isinstance(status.get("error"), str):
        out["status"] = {**status, "error": status["error"].replace(path, os.path.basename(path))}
    return out
