"""``UploadedFiles``: batch jobs' files (the uploaded inputs, the outputs and error files written
at a job's end): their bytes in a folder, their rows in the ``JobDatabase``.

A file's contents are written to a temporary name and renamed into place, then recorded: a file
row always names a whole file. A split daemon's front-end process writes an upload's temporary
file itself (``write_upload``) and the engine's process, which owns the database, adopts it
(``adopt_file``): an upload's bytes never cross the link between them. Files belong to a tenant
(a ``tenant=None`` argument: any owner, for the service's workers and the CLI); a file past its
``expires_at`` is gone to every reader at once, and ``sweep`` deletes its row and bytes later.

Thread-safe as the ``JobDatabase`` is: each call is one short transaction.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llamactor.base.private_files import open_private, private_dir
from llamactor.base.tenants import DEFAULT_TENANT
from llamactor.jobs.database import LIVE, JobDatabase, or_any
from llamactor.jobs.lifecycle import TERMINAL

UPLOAD = re.compile(r"upload-[0-9a-f]{32}\.tmp")  # a front end's upload, not yet adopted
STALE_TMP_S = 3600  # a temporary file this old was left by a process that died writing it


def file_path(files_dir: Path, file_id: str) -> Path:
    """Where a file's bytes are (``KeyError`` for an id that could name a path outside the folder)."""
    if not file_id.replace("-", "").replace("_", "").isalnum():
        raise KeyError(file_id)  # never a path outside the folder
    return files_dir / file_id


def write_whole(path: Path, data: bytes) -> None:
    """``data`` at ``path``, 0600, on disk (fsync) before this returns."""
    with open_private(path) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_upload(files_dir: Path, data: bytes) -> Path:
    """A front end's upload, whole, under a temporary name of its own in ``files_dir`` (any thread)."""
    path = files_dir / f"upload-{uuid.uuid4().hex}.tmp"
    write_whole(path, data)
    return path


class UploadedFiles(JobDatabase):
    """``files_dir``: where the bytes are (None: a store that keeps no files, the CLI's journal)."""

    def __init__(self, db_path: str | Path, files_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(db_path, clock)
        self.files_dir = Path(files_dir) if files_dir is not None else None
        if self.files_dir is not None:
            private_dir(self.files_dir)

    def add_file(self, data: bytes, filename: str, purpose: str, file_id: str | None = None, *,
                 tenant: str = DEFAULT_TENANT, expires_after_s: int | None = None) -> dict[str, Any]:
        """Write ``data`` whole (temporary name, fsync, rename), then record it; returns the row.
        ``expires_after_s``: its life from now (None: until deleted)."""
        file_id = file_id or f"file-{uuid.uuid4().hex[:24]}"
        path = self.file_path(file_id)
        tmp = path.with_name(path.name + ".tmp")
        write_whole(tmp, data)
        return self.adopt_file(tmp, filename, purpose, file_id, tenant=tenant, expires_after_s=expires_after_s)

    def adopt_file(self, tmp: Path, filename: str, purpose: str, file_id: str | None = None, *,
                   tenant: str = DEFAULT_TENANT, expires_after_s: int | None = None) -> dict[str, Any]:
        """The whole file at ``tmp`` (in the files folder) renamed into place, then recorded; the row."""
        file_id = file_id or f"file-{uuid.uuid4().hex[:24]}"
        size = tmp.stat().st_size
        os.replace(tmp, self.file_path(file_id))
        now = self._now()
        row = {"id": file_id, "filename": filename, "purpose": purpose, "bytes": size, "created_at": now,
               "tenant": tenant, "expires_at": None if expires_after_s is None else now + expires_after_s}
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO files (id, filename, purpose, bytes, created_at, tenant, expires_at) "
                       "VALUES (:id, :filename, :purpose, :bytes, :created_at, :tenant, :expires_at)", row)
        return row

    def upload_path(self, name: str) -> Path:
        """A front end's upload by its temporary file's name (``KeyError`` for any other name)."""
        if self.files_dir is None or not UPLOAD.fullmatch(name):
            raise KeyError(name)
        return self.files_dir / name

    def file_path(self, file_id: str) -> Path:
        """Where a file's bytes are (``KeyError`` for an id that could name a path outside the folder)."""
        if self.files_dir is None:
            raise RuntimeError("this store keeps no files")
        return file_path(self.files_dir, file_id)

    def file(self, file_id: str, tenant: str | None = None) -> dict[str, Any] | None:
        """The row of a file not expired (and ``tenant``'s, if given), or None."""
        rows = self._query(f"SELECT * FROM files WHERE id = ? AND {LIVE} AND ? IN (tenant, '*')",
                           (file_id, self._now(), or_any(tenant)))
        return dict(rows[0]) if rows else None

    def files(self, purpose: str | None = None, tenant: str | None = None) -> list[dict[str, Any]]:
        """The files not expired (of ``purpose``, of ``tenant``, when given), newest first."""
        return [dict(r) for r in self._query(
            f"SELECT * FROM files WHERE {LIVE} AND ? IN (purpose, '*') AND ? IN (tenant, '*') "
            "ORDER BY created_at DESC, id", (self._now(), or_any(purpose), or_any(tenant)))]

    def delete_file(self, file_id: str, tenant: str | None = None) -> bool:
        """Delete a file not expired (and ``tenant``'s, if given); False if there is none."""
        with self._tx() as db:
            deleted = db.execute(f"DELETE FROM files WHERE id = ? AND {LIVE} AND ? IN (tenant, '*')",
                                 (file_id, self._now(), or_any(tenant))).rowcount > 0
        if deleted:
            self.file_path(file_id).unlink(missing_ok=True)
        return deleted

    def sweep(self) -> list[str]:
        """Delete every expired file, row and bytes, but the input of a batch not finished (it
        goes at a sweep after the batch ends); returns their ids. Rows first, in one transaction
        with the look at the batches (``JobStore.create_batch`` checks its input in one too, so no
        batch starts on a file being swept); bytes after, as ``delete_file`` does."""
        with self._tx() as db:
            busy = {json.loads(r["data"]).get("input_file_id") for r in db.execute(
                f"SELECT data FROM batches WHERE status NOT IN ({','.join('?' * len(TERMINAL))})", tuple(TERMINAL))}
            expired = [r["id"] for r in db.execute("SELECT id FROM files WHERE expires_at <= ?", (self._now(),))
                       if r["id"] not in busy]
            db.executemany("DELETE FROM files WHERE id = ?", [(file_id,) for file_id in expired])
        for file_id in expired:
            self.file_path(file_id).unlink(missing_ok=True)
        self._sweep_temporaries()
        return expired

    def _sweep_temporaries(self) -> None:
        """Delete the temporary files a process left when it died writing them (a front end killed
        between its upload's write and its adoption): never a row's, only ``*.tmp`` long unchanged."""
        if self.files_dir is None:
            return
        for tmp in self.files_dir.glob("*.tmp"):
            with contextlib.suppress(FileNotFoundError):  # adopted or deleted meanwhile
                if tmp.stat().st_mtime < time.time() - STALE_TMP_S:  # the file system's clock, not the store's
                    tmp.unlink()
