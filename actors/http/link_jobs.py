"""The batch jobs of a split daemon (``--frontend-processes N``; docs/architecture.md, *Batch jobs
behind front-end processes*): one ``JobService`` in the engine's process -- the journal's one
owner and its one runner, whose lines go to the models in-process -- and in every front-end
process a ``LinkJobs``, what the Files and Batch routes call there as they would the service.

Each call crosses the link as one ``jobs`` CALL (``job_calls``: the service's public methods by
name, nothing else). A file's bytes never do: the front end writes an upload to the files folder
under a temporary name and the engine's process adopts it (checked against the tenant's quotas,
renamed into place, recorded), and a download is read from the folder after the engine said the
file is the caller's. The tenant travels in each call: the front end found it from the key.

``LinkJobs`` runs on the routes' worker threads (``asyncio.to_thread``); ``job_calls``' function
on the engine link's call workers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llamactor.base.tenants import DEFAULT_TENANT
from llamactor.jobs.files import file_path, write_upload
from llamactor.jobs.files_api import NotFound
from llamactor.jobs.service import JobService

JOBS = "jobs"  # the CALL's method: (JOBS, None, name, args, kwargs)
# what a front end may ask of the service (file_content is read in the front end, after ``file``)
JOB_CALLS = frozenset({"add_upload", "file", "files", "delete_file", "create", "get", "list_batches", "cancel",
                       "unfinished_batches"})


def job_calls(jobs: JobService) -> Callable[[str, tuple[Any, ...], dict[str, Any]], Any]:
    """The engine's answer to a front end's ``jobs`` CALL: the service's method ``name`` called."""
    def answer(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name not in JOB_CALLS:
            raise ValueError(f"unknown jobs call {name!r}")
        return getattr(jobs, name)(*args, **kwargs)
    return answer


class LinkJobs:
    """The engine's ``JobService`` as a front end's routes call it. ``call``: the link's blocking
    ``EngineConnection.call``; ``files_dir``: the jobs' files folder (the engine's ``--data-dir``)."""

    def __init__(self, call: Callable[..., Any], files_dir: str | Path) -> None:
        self._call = call
        self.files_dir = Path(files_dir)

    def _ask(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._call(JOBS, None, name, args, kwargs)

    def add_file(self, data: bytes, filename: str, purpose: str, *, tenant: str = DEFAULT_TENANT,
                 expires_after: dict[str, Any] | None = None) -> dict[str, Any]:
        """Written here, adopted there; the temporary file is gone either way (renamed or deleted)."""
        tmp = write_upload(self.files_dir, data)
        try:
            return self._ask("add_upload", tmp.name, filename, purpose,  # type: ignore[no-any-return]
                             tenant=tenant, expires_after=expires_after)
        finally:
            with contextlib.suppress(FileNotFoundError):  # adopted: renamed away
                tmp.unlink()

    def file(self, file_id: str, *, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        return self._ask("file", file_id, tenant=tenant)  # type: ignore[no-any-return]

    def files(self, purpose: str | None = None, *, tenant: str = DEFAULT_TENANT) -> list[dict[str, Any]]:
        return self._ask("files", purpose, tenant=tenant)  # type: ignore[no-any-return]

    def file_content(self, file_id: str, *, tenant: str = DEFAULT_TENANT) -> bytes:
        """The bytes of a file the engine says is ``tenant``'s (``NotFound`` as the service's own)."""
        self.file(file_id, tenant=tenant)
        try:
            return file_path(self.files_dir, file_id).read_bytes()
        except FileNotFoundError:  # deleted or swept since the look above
            raise NotFound(f"No file with id {file_id!r}") from None

    def delete_file(self, file_id: str, *, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        return self._ask("delete_file", file_id, tenant=tenant)  # type: ignore[no-any-return]

    def create(self, input_file_id: str, endpoint: str, completion_window: str = "24h",
               metadata: dict[str, str] | None = None, *, tenant: str = DEFAULT_TENANT,
               output_expires_after: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._ask("create", input_file_id, endpoint, completion_window,  # type: ignore[no-any-return]
                         metadata, tenant=tenant, output_expires_after=output_expires_after)

    def get(self, batch_id: str, *, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        return self._ask("get", batch_id, tenant=tenant)  # type: ignore[no-any-return]

    def list_batches(self, limit: int = 20, after: str | None = None, *,
                     tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        return self._ask("list_batches", limit, after, tenant=tenant)  # type: ignore[no-any-return]

    def cancel(self, batch_id: str, *, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        return self._ask("cancel", batch_id, tenant=tenant)  # type: ignore[no-any-return]

    def unfinished_batches(self) -> list[dict[str, Any]]:
        return self._ask("unfinished_batches")  # type: ignore[no-any-return]
