"""OpenAI's Files API for batch jobs: ``POST /files`` (multipart, ``purpose=batch``), ``GET /files``,
``GET /files/{id}``, ``GET /files/{id}/content``, ``DELETE /files/{id}``, under ``/v1`` and at the
root, over the daemon's ``JobService`` (in a front-end process, the engine's: ``link_jobs``).
Each caller sees its own tenant's files only (another's are a 404, as an unknown id is); an
upload may set OpenAI's ``expires_after`` (multipart fields ``expires_after[anchor]=created_at``
and ``expires_after[seconds]``; default 30 days).

Handlers run on uvicorn's event loop; the store's disk work runs in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response

from llamactor.dialects.errors import ErrorInfo
from llamactor.http.errors import error_response
from llamactor.http.state import Jobs, ServerState, State, tenant_of
from llamactor.jobs.service import NotFound

T = TypeVar("T")
router = APIRouter()


async def call_jobs(request: Request, state: ServerState, work: Callable[[Jobs], T]) -> T | JSONResponse:
    """Run ``work`` on the job service off the loop; a 503 when jobs are off, a 404 for an unknown id."""
    jobs = state.jobs
    if jobs is None:
        return error_response(request.url.path, ErrorInfo(
            503, "batch jobs are off: this server has no data directory it can own (see --data-dir)",
            "server_error", "jobs_unavailable"))
    try:
        return await asyncio.to_thread(work, jobs)
    except NotFound as e:
        return error_response(request.url.path, ErrorInfo(404, str(e), "invalid_request_error", "not_found"))


@router.post("/files", response_model=None)
async def upload(request: Request, state: State, file: UploadFile = File(...), purpose: str = Form(...),
                 anchor: str | None = Form(None, alias="expires_after[anchor]"),
                 seconds: str | None = Form(None, alias="expires_after[seconds]")) -> Any:
    data = await file.read()
    # given as text, checked by the service (one 400 for a bad anchor or a number out of range)
    expires_after = None if anchor is None and seconds is None else {"anchor": anchor, "seconds": seconds}
    tenant = tenant_of(request).name
    return await call_jobs(request, state, lambda jobs: jobs.add_file(
        data, file.filename or "upload.jsonl", purpose, tenant=tenant, expires_after=expires_after))


@router.get("/files", response_model=None)
async def listing(request: Request, state: State, purpose: str | None = None) -> Any:
    tenant = tenant_of(request).name
    found = await call_jobs(request, state, lambda jobs: jobs.files(purpose, tenant=tenant))
    if isinstance(found, JSONResponse):
        return found
    return {"object": "list", "data": found, "has_more": False,
            "first_id": found[0]["id"] if found else None, "last_id": found[-1]["id"] if found else None}


@router.get("/files/{file_id}", response_model=None)
async def retrieve(request: Request, state: State, file_id: str) -> Any:
    tenant = tenant_of(request).name
    return await call_jobs(request, state, lambda jobs: jobs.file(file_id, tenant=tenant))


@router.get("/files/{file_id}/content", response_model=None)
async def content(request: Request, state: State, file_id: str) -> Any:
    tenant = tenant_of(request).name
    data = await call_jobs(request, state, lambda jobs: jobs.file_content(file_id, tenant=tenant))
    if isinstance(data, JSONResponse):
        return data
    return Response(data, media_type="application/jsonl")


@router.delete("/files/{file_id}", response_model=None)
async def delete(request: Request, state: State, file_id: str) -> Any:
    tenant = tenant_of(request).name
    return await call_jobs(request, state, lambda jobs: jobs.delete_file(file_id, tenant=tenant))
