"""llama-server's router-mode model management: ``POST /models/load`` and ``POST /models/unload``
with ``{"model": NAME}`` (uvicorn's event loop; loading and unloading run off it). ``GET /models``
(each model's ``status``, ``path`` -- for admins -- and ``size``) is the OpenAI list's (``openai_routes``).

As llama-server answers: an unknown name is a 404, loading a loaded model or unloading one that
is not loaded a 400, ``{"success": true}`` otherwise. Unlike llama-server, ``load`` answers once
the model is loaded (a file that cannot be loaded: the ``ModelLoadError``, a 500 naming file and
reason), so a script needs no polling. With tenants' keys both are for admin keys: unloading
stops everyone's work on the model, loading may evict another.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel

from llamactor.base.errors import InvalidRequestError, ModelNotFoundError, PermissionDeniedError
from llamactor.http.request_path import find_model
from llamactor.http.state import ServerState, State, tenant_of

UNLOAD_DRAIN_S = 30.0  # requests in flight on the model get this long to finish
router = APIRouter()


class ModelAction(BaseModel):
    model: str


def managed_model(state: ServerState, request: Request, name: str) -> Any:
    """The router that can load and unload ``name``: 403 for a non-admin (with tenants' keys),
    404 for a name this server does not serve (here no name stands for the only model)."""
    if state.tenant_keys and not tenant_of(request).admin:
        raise PermissionDeniedError("loading and unloading models is for admin keys")
    if name not in state.model_names:
        raise ModelNotFoundError.among(name, state.model_names)
    find_model(state, name)  # 503 while the server starts or drains
    if not hasattr(state.router, "unload"):
        raise InvalidRequestError("models served by Ray Serve are not loaded or unloaded by name")
    return state.router


@router.post("/models/load")
async def load(body: ModelAction, request: Request, state: State) -> dict[str, Any]:
    models = managed_model(state, request, body.model)
    if models.model(body.model).loaded:
        raise InvalidRequestError(f"model {body.model!r} is already loaded")
    await asyncio.to_thread(models.load, body.model)
    return {"success": True}


@router.post("/models/unload")
async def unload(body: ModelAction, request: Request, state: State) -> dict[str, Any]:
    models = managed_model(state, request, body.model)
    if not models.model(body.model).loaded:
        raise InvalidRequestError(f"model {body.model!r} is not loaded")
    await asyncio.to_thread(models.unload, body.model, UNLOAD_DRAIN_S)
    return {"success": True}
