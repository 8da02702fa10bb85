"""OpenAI's Files API for batch jobs: ``POST /v1/files`` (multipart, ``purpose=batch``),
``GET /v1/files``, ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``
(each also without ``/v1``), over the daemon's ``JobService``.

Handlers run on uvicorn's event loop; the store's disk work runs in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response

from llamactor.http.errors import error_response
from llamactor.http.state import ServerState
from llamactor.jobs.service import JobService, NotFound

T = TypeVar("T")


def both(path: str) -> list[str]:
    return [path, path.removeprefix("/v1")]


async def call_jobs(request: Request, state: ServerState, work: Callable[[JobService], T]) -> T | JSONResponse:
    """Run ``work`` on the job service off the loop; a 503 when jobs are off, a 404 for an unknown id."""
    jobs = state.jobs
    if jobs is None:
        return error_response(request.url.path, 503, "batch jobs are off: this server has no data directory it can "
                              "own (see --data-dir)", "server_error", "jobs_unavailable")
    try:
        return await asyncio.to_thread(work, jobs)
    except NotFound as e:
        return error_response(request.url.path, 404, str(e), "invalid_request_error", "not_found")


def register(app: FastAPI, state: ServerState) -> None:
    async def upload(request: Request, file: UploadFile = File(...), purpose: str = Form(...)) -> Any:
        data = await file.read()
        return await call_jobs(request, state, lambda jobs: jobs.add_file(data, file.filename or "upload.jsonl", purpose))

    async def listing(request: Request, purpose: str | None = None) -> Any:
        found = await call_jobs(request, state, lambda jobs: jobs.files(purpose))
        if isinstance(found, JSONResponse):
            return found
        return {"object": "list", "data": found, "has_more": False,
                "first_id": found[0]["id"] if found else None, "last_id": found[-1]["id"] if found else None}

    async def retrieve(request: Request, file_id: str) -> Any:
        return await call_jobs(request, state, lambda jobs: jobs.file(file_id))

    async def content(request: Request, file_id: str) -> Any:
        data = await call_jobs(request, state, lambda jobs: jobs.file_content(file_id))
        if isinstance(data, JSONResponse):
            return data
        return Response(data, media_type="application/jsonl")

    async def delete(request: Request, file_id: str) -> Any:
        return await call_jobs(request, state, lambda jobs: jobs.delete_file(file_id))

    routes: list[tuple[str, str, Callable[..., Awaitable[Any]]]] = [
        ("POST", "/v1/files", upload), ("GET", "/v1/files", listing), ("GET", "/v1/files/{file_id}", retrieve),
        ("GET", "/v1/files/{file_id}/content", content), ("DELETE", "/v1/files/{file_id}", delete)]
    for method, path, handler in routes:
        for p in both(path):
            app.add_api_route(p, handler, methods=[method], response_model=None)
