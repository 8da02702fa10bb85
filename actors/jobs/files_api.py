"""``FilesApi``: OpenAI's files endpoints over a ``JobStore``, and the sweeper of expired files.

Files (a batch's output and error files too) belong to the tenant that made them: the public
methods take the caller's ``tenant`` name, and another tenant's file is ``NotFound`` as an unknown
id is. A tenant keeps at most its ``max_files`` files of ``max_file_bytes`` together
(``quotas``). Files expire (``expires_after``, default 30 days): an expired file is gone at once,
and the sweeper thread deletes its bytes when the service starts and every ``sweep_every_s``
after, keeping the input of a batch not finished. ``JobService`` (``jobs/service.py``) is these
endpoints and the batches'.

Methods are called from the HTTP handlers (through ``asyncio.to_thread``) and the job workers;
``_sweep_until_closed`` runs on the sweeper thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.base.logging import get_logger
from llamactor.base.tenants import DEFAULT_TENANT, Tenant, tenant_named
from llamactor.jobs import quotas, records
from llamactor.jobs.journal import JobStore

log = get_logger("llamactor.jobs")


class NotFound(LookupError):
    """No file or batch of that id (a 404)."""


def _upload_expiry(purpose: str, expires_after: dict[str, Any] | None) -> int | None:
    """An upload's life in seconds (``InvalidRequestError`` for a purpose or policy refused)."""
    if purpose != "batch":
        raise InvalidRequestError(f"purpose must be 'batch' (got {purpose!r}): llamactor keeps batch input files only")
    return records.expiry_seconds(expires_after, "expires_after")


class FilesApi:
    """``sweep_every_s``: how often expired files are deleted."""

    def __init__(self, store: JobStore, sweep_every_s: float = 3600.0) -> None:
        self.store = store
        self.sweep_every_s = sweep_every_s
        # A tenant by name -> its quotas, and the tenant a batch's lines run as (the daemon: from
        # its keys, as they stand when asked; else a tenant with the defaults).
        self.tenant: Callable[[str], Tenant] = tenant_named
        self._lock = threading.Lock()  # a quota's check and the add it allows, together
        self._stopped = threading.Event()  # close(): the sweeper's wait ends at once
        self._sweeper: threading.Thread | None = None

    def add_file(self, data: bytes, filename: str, purpose: str, *, tenant: str = DEFAULT_TENANT,
                 expires_after: dict[str, Any] | None = None) -> dict[str, Any]:
        """A new file of ``tenant``; ``expires_after``: OpenAI's policy (default 30 days)."""
        seconds = _upload_expiry(purpose, expires_after)
        with self._lock:  # (the check and the add together: two uploads at once cannot both pass it)
            quotas.check_new_file(self.tenant(tenant), self.store.files(None, tenant), len(data))
            return records.file_object(self.store.add_file(data, filename, purpose, tenant=tenant,
                                                           expires_after_s=seconds))

    def add_upload(self, name: str, filename: str, purpose: str, *, tenant: str = DEFAULT_TENANT,
                   expires_after: dict[str, Any] | None = None) -> dict[str, Any]:
        """``add_file`` of the bytes a front-end process wrote to the files folder as ``name``
        (``files.write_upload``): checked as they would be, then adopted; a refused upload's
        file is left where it is (its writer deletes it)."""
        seconds = _upload_expiry(purpose, expires_after)
        tmp = self.store.upload_path(name)
        with self._lock:
            quotas.check_new_file(self.tenant(tenant), self.store.files(None, tenant), tmp.stat().st_size)
            return records.file_object(self.store.adopt_file(tmp, filename, purpose, tenant=tenant,
                                                             expires_after_s=seconds))

    def file(self, file_id: str, *, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        row = self.store.file(file_id, tenant)
        if row is None:
            raise NotFound(f"No file with id {file_id!r}")
        return records.file_object(row)

    def files(self, purpose: str | None = None, *, tenant: str = DEFAULT_TENANT) -> list[dict[str, Any]]:
        return [records.file_object(r) for r in self.store.files(purpose, tenant)]

    def file_content(self, file_id: str, *, tenant: str = DEFAULT_TENANT) -> bytes:
        self.file(file_id, tenant=tenant)
        try:
            return self.store.file_path(file_id).read_bytes()
        except FileNotFoundError:  # deleted or swept since the look above
            raise NotFound(f"No file with id {file_id!r}") from None

    def delete_file(self, file_id: str, *, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        if not self.store.delete_file(file_id, tenant):
            raise NotFound(f"No file with id {file_id!r}")
        return {"id": file_id, "object": "file", "deleted": True}

    def _start_sweeper(self) -> None:
        self._sweeper = threading.Thread(target=self._sweep_until_closed, name="jobs-sweeper", daemon=True)
        self._sweeper.start()

    def _stop_sweeper(self, timeout_s: float) -> None:
        self._stopped.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout_s)

    def _sweep_until_closed(self) -> None:
        """The sweeper thread: expired files deleted now, then every ``sweep_every_s`` until ``close``."""
        while not self._stopped.is_set():
            try:
                if gone := self.store.sweep():
                    log.info("files_expired", files=len(gone), file_ids=gone[:20])
            except Exception as e:  # noqa: BLE001 - a failed sweep (disk full, ...) is retried at the next
                log.error("files_sweep_failed", error=repr(e))
            self._stopped.wait(self.sweep_every_s)
