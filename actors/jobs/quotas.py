"""A tenant's quotas on what it keeps and runs in the daemon's data dir (pure): its batch jobs not
finished (each has a worker thread) and its files (uploads and batch outputs: their number and
bytes), from its ``Tenant``'s ``max_batch_jobs``, ``max_files``, ``max_file_bytes``. A new batch
over the first is a 429 (it may be created once one finishes); an upload over the others a 400
(files must be deleted, or expire, first). Batch outputs are never refused: they count against
the next upload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llamactor.base.errors import InvalidRequestError, QueueFullError
from llamactor.base.tenants import Tenant

UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")


def check_new_job(tenant: Tenant, unfinished: int) -> None:
    """``QueueFullError`` (429) when ``tenant`` already has ``max_batch_jobs`` jobs not finished."""
    if tenant.max_batch_jobs is not None and unfinished >= tenant.max_batch_jobs:
        raise QueueFullError(f"tenant {tenant.name!r} already has {unfinished} batch jobs not finished, its limit "
                             f"(max_batch_jobs={tenant.max_batch_jobs}); create this one once one of them has "
                             "finished, or cancel one")


def check_new_file(tenant: Tenant, files: Sequence[dict[str, Any]], size: int) -> None:
    """``InvalidRequestError`` (400) when one more file of ``size`` bytes goes beyond ``tenant``'s
    ``max_files`` or ``max_file_bytes`` (``files``: the ones it keeps, with their ``bytes``)."""
    if tenant.max_files is not None and len(files) >= tenant.max_files:
        raise InvalidRequestError(f"tenant {tenant.name!r} already keeps {len(files)} files, its limit "
                                  f"(max_files={tenant.max_files}); delete some first")
    held = sum(int(f["bytes"]) for f in files)
    if tenant.max_file_bytes is not None and held + size > tenant.max_file_bytes:
        raise InvalidRequestError(f"this file ({size} bytes) and the {held} bytes tenant {tenant.name!r} keeps already "
                                  f"exceed its limit (max_file_bytes={tenant.max_file_bytes}); delete some first")
