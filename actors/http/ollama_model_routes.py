"""The Ollama dialect's model routes: ``/api/tags``, ``/api/ps``, ``/api/show``, ``/api/pull``,
``/api/version``, ``/`` ("Ollama is running"), and answers for the model-management routes that
llamactor does not have (push, create, copy, delete, blobs) (uvicorn's event loop).

What they say of a model comes from its GGUF header (``llamactor.native.gguf_header``, read off
the loop: listing must not load a model) and is shaped by ``llamactor.dialects.ollama.models``.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response

from llamactor.base.errors import LlamactorError
from llamactor.base.models import resolve_model_path
from llamactor.dialects.errors import ErrorInfo
from llamactor.dialects.ollama.models import ps_entry, show_body, tag_entry
from llamactor.dialects.ollama.replies import stream_error
from llamactor.dialects.ollama.schema import PullRequest, ShowRequest
from llamactor.handles.model import ModelClient
from llamactor.http.errors import error_response
from llamactor.http.framing import NDJSON, stream_response
from llamactor.http.ollama_routes import lookup
from llamactor.http.state import ServerState, State, tenant_of
from llamactor.native.gguf_header import GgufFile, read_gguf

# What /api/version reports: numeric (Open WebUI parses it into ints) and >= 0.6.4 (VS Code
# Copilot's minimum); Ollama 0.12 has everything answered here (tools, thinking, dimensions).
VERSION = os.environ.get("LLAMACTOR_OLLAMA_VERSION", "0.12.0")
if not re.fullmatch(r"\d+(\.\d+)*", VERSION):
    raise ValueError(f"LLAMACTOR_OLLAMA_VERSION must be a numeric version such as 0.12.0, got {VERSION!r}")
FOREVER = timedelta(days=292 * 365)  # Ollama's "never expires" (a max int64 of nanoseconds)
UNSUPPORTED = {"/api/push": "POST", "/api/create": "POST", "/api/copy": "POST", "/api/delete": "DELETE",
               "/api/blobs/{digest}": "POST"}
router = APIRouter()


async def describe(state: ServerState, name: str, verbose: bool = False) -> tuple[ModelClient, GgufFile | None]:
    llm = lookup(state, name)
    try:
        path = resolve_model_path(llm.config.model)
    except LlamactorError:  # not on this node (a Ray ingress): described without the file
        return llm, None
    return llm, await asyncio.to_thread(read_gguf, path, verbose)


@router.api_route("/api/tags", methods=["GET", "HEAD"])
async def tags(state: State) -> dict[str, Any]:
    return {"models": [tag_entry(name, (await describe(state, name))[1]) for name in state.model_names]}


@router.get("/api/ps")
async def ps(state: State) -> dict[str, Any]:
    """The loaded models; each expires when its idle_unload_s would unload it (else never)."""
    now, models = datetime.now(timezone.utc), []
    for name in state.model_names:
        llm, gguf = await describe(state, name)
        if not llm.loaded:
            continue
        spec = getattr(llm, "spec", None)
        idle_s = None if spec is None or spec.pin else spec.idle_unload_s  # a pinned model never expires
        last_used = getattr(llm, "last_used", None)
        expires = FOREVER if idle_s is None or last_used is None else timedelta(
            seconds=max(0.0, idle_s - (time.monotonic() - last_used)))
        # in-process, the engine's per-sequence window and offload (the model is loaded); under Ray,
        # the configured ones
        info = getattr(llm, "info", None) if hasattr(type(llm), "info") else None
        offloaded = info.gpu_offload and info.n_gpu_layers != 0 if info is not None else bool(llm.config.n_gpu_layers)
        models.append(ps_entry(name, gguf, offloaded, now + expires,
                               info.n_ctx_seq if info is not None else llm.config.n_ctx))
    return {"models": sorted(models, key=lambda m: m["expires_at"], reverse=True)}


@router.post("/api/show")
async def show(body: ShowRequest, request: Request, state: State) -> dict[str, Any]:
    """The Modelfile (the model's path) and the system prompt for admins only (keyless: everyone)."""
    name = body.model or body.name or ""
    llm, gguf = await describe(state, name, bool(body.verbose))
    return show_body(name, llm.config, gguf, operator=tenant_of(request).admin)


@router.post("/api/pull", response_model=None)
async def pull(body: PullRequest, state: State) -> Response:
    """A model this server serves is already "pulled" (scripts pull before they chat); no other can be."""
    lookup(state, body.model or body.name or "")
    if body.stream is False:
        return JSONResponse({"status": "success"})

    async def line() -> AsyncGenerator[dict[str, Any], None]:
        yield {"status": "success"}
    return stream_response(line(), NDJSON, stream_error)


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version() -> dict[str, str]:
    return {"version": VERSION}


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root(request: Request) -> Response:
    """Ollama's heartbeat for its clients; a browser (it asks for HTML) lands on the web page."""
    if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        return RedirectResponse("/ui/", status_code=302)
    return PlainTextResponse("Ollama is running")


def unsupported(path: str) -> Callable[[Request], Awaitable[JSONResponse]]:
    async def refuse(request: Request) -> JSONResponse:
        return error_response(request.url.path, ErrorInfo(
            501, f"{path.removeprefix('/api/').split('/')[0]} is not supported: llamactor serves the GGUF files it "
            "was started with (--model NAME=PATH)", "not_supported_error"))
    return refuse


for _path, _method in UNSUPPORTED.items():
    router.add_api_route(_path, unsupported(_path), methods=[_method, "HEAD"] if "blobs" in _path else [_method])
