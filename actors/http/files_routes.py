"""OpenAI's Files API for batch jobs: ``POST /files`` (multipart, ``purpose=batch``), ``GET /files``,
``GET /files/{id}``, ``GET /files/{id}/content``, ``DELETE /files/{id}``, under ``/v1`` and at the
root, over the daemon's ``JobService``.

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
from llamactor.http.state import ServerState, State
from llamactor.jobs.service import JobService, NotFound

T = TypeVar("T")
router = APIRouter()


async def call_jobs(request: Request, state: ServerState, work: Callable[[JobService], T]) -> T | JSONResponse:
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
async def upload(request: Request, state: State, file: UploadFile = File(...), purpose: str = Form(...)) -> Any:
    data = await file.read()
    return await call_jobs(request, state, lambda jobs: jobs.add_file(data, file.filename or "upload.jsonl", purpose))


@router.get("/files", response_model=None)
async def listing(request: Request, state: State, purpose: str | None = None) -> Any:
    found = await call_jobs(request, state, lambda jobs: jobs.files(purpose))
    if isinstance(found, JSONResponse):
        return found
    return {"object": "list", "data": found, "has_more": False,
            "first_id": found[0]["id"] if found else None, "last_id": found[-1]["id"] if found else None}


@router.get("/files/{file_id}", response_model=None)
async def retrieve(request: Request, state: State, file_id: str) -> Any:
    return await call_jobs(request, state, lambda jobs: jobs.file(file_id))


@router.get("/files/{file_id}/content", response_model=None)
async def content(request: Request, state: State, file_id: str) -> Any:
    data = await call_jobs(request, state, lambda jobs: jobs.file_content(file_id))
    if isinstance(data, JSONResponse):
        return data
    return Response(data, media_type="application/jsonl")


@router.delete("/files/{file_id}", response_model=None)
async def delete(request: Request, state: State, file_id: str) -> Any:
    return await call_jobs(request, state, lambda jobs: jobs.delete_file(file_id))
