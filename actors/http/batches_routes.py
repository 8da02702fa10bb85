"""OpenAI's Batch API: ``POST /batches``, ``GET /batches/{id}``, ``GET /batches``,
``POST /batches/{id}/cancel``, under ``/v1`` and at the root, over the daemon's ``JobService``:
jobs journaled on disk, run at low priority, resumed when the daemon restarts. Each caller sees
its own tenant's batches only (another's are a 404, as an unknown id is); ``output_expires_after``
sets how long a batch's output and error files live (default 30 days).

Handlers run on uvicorn's event loop; the store's disk work runs in a worker thread.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from llamactor.http.files_routes import call_jobs
from llamactor.http.state import State, tenant_of

router = APIRouter()


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    output_expires_after: dict[str, Any] | None = None  # checked by the service: {"anchor", "seconds"}


@router.post("/batches", response_model=None)
async def create(body: CreateBatch, request: Request, state: State) -> Any:
    tenant = tenant_of(request).name
    return await call_jobs(request, state, lambda jobs: jobs.create(
        body.input_file_id, body.endpoint, body.completion_window, body.metadata, tenant=tenant,
        output_expires_after=body.output_expires_after))


@router.get("/batches/{batch_id}", response_model=None)
async def retrieve(request: Request, state: State, batch_id: str) -> Any:
    tenant = tenant_of(request).name
    return await call_jobs(request, state, lambda jobs: jobs.get(batch_id, tenant=tenant))


@router.get("/batches", response_model=None)
async def listing(request: Request, state: State, limit: int = Query(20, ge=1, le=100), after: str | None = None) -> Any:
    tenant = tenant_of(request).name
    return await call_jobs(request, state, lambda jobs: jobs.list_batches(limit, after, tenant=tenant))


@router.post("/batches/{batch_id}/cancel", response_model=None)
async def cancel(request: Request, state: State, batch_id: str) -> Any:
    tenant = tenant_of(request).name
    return await call_jobs(request, state, lambda jobs: jobs.cancel(batch_id, tenant=tenant))
