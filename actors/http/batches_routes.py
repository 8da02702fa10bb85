"""OpenAI's Batch API: ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``GET /v1/batches``,
``POST /v1/batches/{id}/cancel`` (each also without ``/v1``), over the daemon's ``JobService``:
jobs journaled on disk, run at low priority, resumed when the daemon restarts.

Handlers run on uvicorn's event loop; the store's disk work runs in a worker thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from llamactor.http.files_routes import both, call_jobs
from llamactor.http.state import ServerState


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    output_expires_after: dict[str, Any] | None = None  # accepted: files here never expire


def register(app: FastAPI, state: ServerState) -> None:
    async def create(body: CreateBatch, request: Request) -> Any:
        return await call_jobs(request, state, lambda jobs: jobs.create(
            body.input_file_id, body.endpoint, body.completion_window, body.metadata))

    async def retrieve(request: Request, batch_id: str) -> Any:
        return await call_jobs(request, state, lambda jobs: jobs.get(batch_id))

    async def listing(request: Request, limit: int = Query(20, ge=1, le=100), after: str | None = None) -> Any:
        return await call_jobs(request, state, lambda jobs: jobs.list_batches(limit, after))

    async def cancel(request: Request, batch_id: str) -> Any:
        return await call_jobs(request, state, lambda jobs: jobs.cancel(batch_id))

    routes: list[tuple[str, str, Callable[..., Awaitable[Any]]]] = [
        ("POST", "/v1/batches", create), ("GET", "/v1/batches", listing),
        ("GET", "/v1/batches/{batch_id}", retrieve), ("POST", "/v1/batches/{batch_id}/cancel", cancel)]
    for method, path, handler in routes:
        for p in both(path):
            app.add_api_route(p, handler, methods=[method], response_model=None)
