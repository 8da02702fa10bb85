"""OpenAI's Batch API: ``POST /batches``, ``GET /batches/{id}``, ``GET /batches``,
``POST /batches/{id}/cancel``, under ``/v1`` and at the root, over the daemon's ``JobService``:
jobs journaled on disk, run at low priority, resumed when the daemon restarts.

Handlers run on uvicorn's event loop; the store's disk work runs in a worker thread.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from llamactor.http.files_routes import call_jobs
from llamactor.http.state import State

router = APIRouter()


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    output_expires_after: dict[str, Any] | None = None  # accepted: files here never expire


@router.post("/batches", response_model=None)
async def create(body: CreateBatch, request: Request, state: State) -> Any:
    return await call_jobs(request, state, lambda jobs: jobs.create(
        body.input_file_id, body.endpoint, body.completion_window, body.metadata))


@router.get("/batches/{batch_id}", response_model=None)
async def retrieve(request: Request, state: State, batch_id: str) -> Any:
    return await call_jobs(request, state, lambda jobs: jobs.get(batch_id))


@router.get("/batches", response_model=None)
async def listing(request: Request, state: State, limit: int = Query(20, ge=1, le=100), after: str | None = None) -> Any:
    return await call_jobs(request, state, lambda jobs: jobs.list_batches(limit, after))


@router.post("/batches/{batch_id}/cancel", response_model=None)
async def cancel(request: Request, state: State, batch_id: str) -> Any:
    return await call_jobs(request, state, lambda jobs: jobs.cancel(batch_id))
