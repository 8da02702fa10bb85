"""``JobStore``: batch jobs on disk, a SQLite journal (the standard library's, WAL) plus a files folder.

Every line of a job has a row: pending -> running -> done / failed, with its output-file entry.
A result is committed before it counts, so a process killed at any moment (``kill -9``) loses at
most the requests it had in flight, and a restart runs exactly the lines not done. A line is
``running`` only while a process has it in flight (a run that stops gives its lines back,
``release``). A process that dies of a fault (SIGSEGV, SIGABRT: a native crash, which one line
can cause) writes its traceback to ``<journal>.faults`` (``faulthandler``); the next store opened
on the journal logs it and counts a crash against each line left ``running`` (``crashes``), and
the runner fails a line counted twice instead of replaying it for ever. A process killed
(SIGKILL, the OOM killer, a power loss) writes nothing: its lines are given back uncounted,
since the kill was not theirs. File contents
are written to a temporary name and renamed into place, then recorded: a file row always names
a whole file. Files and batches belong to a tenant (a ``tenant=None`` argument: any owner, for
the service's workers and the CLI); a file past its ``expires_at`` is gone to every reader at
once, and ``sweep`` deletes its row and bytes later. One lock file per store (``fcntl.flock``)
keeps a second process from running the same jobs; the kernel releases it when its holder dies.

Thread-safe: one connection, used under a lock, by whichever thread calls (the HTTP event loop's
executor, a job's runner thread, the service's sweeper thread, the CLI's main thread). Each call
is one short transaction. Timestamps come from ``clock`` (a fake one in tests).
"""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llamactor.base.logging import get_logger
from llamactor.base.private_files import open_private, private_dir, tighten_file, touch_private
from llamactor.base.tenants import DEFAULT_TENANT
from llamactor.jobs.input_lines import InputLine
from llamactor.jobs.lifecycle import TERMINAL, TIMESTAMP_OF, RequestCounts, check_transition
from llamactor.jobs.records import FILE_TTL_S

# New columns go at the end, and into ADDED_COLUMNS: a journal made before them gets them there.
SCHEMA = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT NOT NULL,
                                  bytes INTEGER NOT NULL, created_at INTEGER NOT NULL,
                                  tenant TEXT NOT NULL DEFAULT 'default', expires_at INTEGER);
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, status TEXT NOT NULL, created_at INTEGER NOT NULL,
                                    data TEXT NOT NULL, tenant TEXT NOT NULL DEFAULT 'default');
CREATE TABLE IF NOT EXISTS lines (batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, rank INTEGER NOT NULL,
                                  custom_id TEXT, body TEXT, state TEXT NOT NULL, result TEXT,
                                  crashes INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (batch_id, line_no));
CREATE INDEX IF NOT EXISTS lines_by_state ON lines (batch_id, state, rank);
CREATE TABLE IF NOT EXISTS runs (batch_id TEXT NOT NULL, run_no INTEGER NOT NULL, pid INTEGER NOT NULL,
                                 started_at REAL NOT NULL, tokens_computed INTEGER NOT NULL DEFAULT 0,
                                 PRIMARY KEY (batch_id, run_no));
"""
LINE_STATES = ("pending", "running", "done", "failed")
ADDED_COLUMNS = (("files", "tenant", "TEXT NOT NULL DEFAULT 'default'"), ("files", "expires_at", "INTEGER"),
                 ("batches", "tenant", "TEXT NOT NULL DEFAULT 'default'"),
                 ("lines", "crashes", "INTEGER NOT NULL DEFAULT 0"))
LIVE = "(expires_at IS NULL OR expires_at > ?)"  # a file row not expired at the time given
# Filters by an optional argument: ``? IN (tenant, '*')`` with '*' (None) passes every row; no tenant
# name or purpose is '*'.
ANY = "*"


def _any(value: str | None) -> str:
    return ANY if value is None else value  # "" is nobody's, not everyone's


log = get_logger("llamactor.jobs")


class StoreLockedError(RuntimeError):
    """Another live process holds this store."""


class JobStore:
    def __init__(self, db_path: str | Path, files_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.db_path = Path(db_path)
        # tenants' prompts and answers: files 0600 in 0700 folders (a journal's existing folder, the
        # CLI's output folder, is left as it is)
        private_dir(self.db_path.parent, tighten=False)
        self.files_dir = Path(files_dir) if files_dir is not None else None
        if self.files_dir is not None:
            private_dir(self.files_dir)
        self._lock_file = open_private(self.db_path.with_name(self.db_path.name + ".lock"), "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StoreLockedError(f"{self.db_path} is in use by another llamactor process") from None
        touch_private(self.db_path)  # SQLite gives its -wal and -shm files the database file's mode
        for left in ("-wal", "-shm"):  # an older version's, made 0644
            tighten_file(self.db_path.with_name(self.db_path.name + left))
        # autocommit mode: every transaction is an explicit BEGIN IMMEDIATE ... COMMIT below.
        self._db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.row_factory = sqlite3.Row
        # WAL + synchronous NORMAL: a commit survives the process being killed at any moment
        # (only a power loss can lose the last ones, which are then simply computed again).
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._mutex = threading.Lock()
        self._migrate()
        self._watch_faults()

    @classmethod
    def in_data_dir(cls, data_dir: str | Path) -> JobStore:
        """The daemon's store: ``<data_dir>/jobs.sqlite3`` and ``<data_dir>/files/``."""
        return cls(private_dir(data_dir) / "jobs.sqlite3", Path(data_dir) / "files")

    def close(self) -> None:
        with self._mutex:
            faulthandler.disable()
            if self._faulthandler_was_enabled:
                faulthandler.enable()  # to stderr, as it was (python -X faulthandler, pytest)
            self._faults.close()
            self._db.close()
            self._lock_file.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._mutex:
            return self._db.execute(sql, args).fetchall()

    def _now(self) -> int:
        return int(self.clock())

    def _migrate(self) -> None:
        """Add the columns a journal made by an older llamactor lacks, in one transaction: its rows
        belong to the default tenant, and its files expire ``FILE_TTL_S`` after this upgrade
        (not after their creation: an upgrade deletes nothing at once)."""
        with self._tx() as db:
            for table, column, declared in ADDED_COLUMNS:
                if column not in {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declared}")
                    if (table, column) == ("files", "expires_at"):
                        db.execute("UPDATE files SET expires_at = ?", (self._now() + FILE_TTL_S,))

    def _watch_faults(self) -> None:
        """Count a crash against the lines the last holder left ``running`` if it died of a fault
        (its traceback in the faults file, logged here); then arm this process's fault log."""
        fd = os.open(self.db_path.with_name(self.db_path.name + ".faults"), os.O_RDWR | os.O_CREAT, 0o600)
        self._faults = os.fdopen(fd, "r+")
        fault = self._faults.read().strip()
        if fault:
            with self._tx() as db:
                charged = db.execute("UPDATE lines SET crashes = crashes + 1, state = 'pending' "
                                     "WHERE state = 'running'").rowcount
            log.error("job_process_faulted", journal=str(self.db_path), lines_in_flight=charged, fault=fault[-4000:])
        self._faults.seek(0)
        self._faults.truncate()
        self._faulthandler_was_enabled = faulthandler.is_enabled()
        faulthandler.enable(self._faults, all_threads=True)

    # -- files ---------------------------------------------------------------------------------

    def add_file(self, data: bytes, filename: str, purpose: str, file_id: str | None = None, *,
                 tenant: str = DEFAULT_TENANT, expires_after_s: int | None = None) -> dict[str, Any]:
        """Write ``data`` whole (temporary name, fsync, rename), then record it; returns the row.
        ``expires_after_s``: its life from now (None: until deleted)."""
        file_id = file_id or f"file-{uuid.uuid4().hex[:24]}"
        path = self.file_path(file_id)
        tmp = path.with_name(path.name + ".tmp")
        with open_private(tmp) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        now = self._now()
        row = {"id": file_id, "filename": filename, "purpose": purpose, "bytes": len(data), "created_at": now,
               "tenant": tenant, "expires_at": None if expires_after_s is None else now + expires_after_s}
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO files (id, filename, purpose, bytes, created_at, tenant, expires_at) "
                       "VALUES (:id, :filename, :purpose, :bytes, :created_at, :tenant, :expires_at)", row)
        return row

    def file_path(self, file_id: str) -> Path:
        if self.files_dir is None:
            raise RuntimeError("this store keeps no files")
        if not file_id.replace("-", "").replace("_", "").isalnum():
            raise KeyError(file_id)  # never a path outside the folder
        return self.files_dir / file_id

    def file(self, file_id: str, tenant: str | None = None) -> dict[str, Any] | None:
        """The row of a file not expired (and ``tenant``'s, if given), or None."""
        rows = self._query(f"SELECT * FROM files WHERE id = ? AND {LIVE} AND ? IN (tenant, '*')",
                           (file_id, self._now(), _any(tenant)))
        return dict(rows[0]) if rows else None

    def files(self, purpose: str | None = None, tenant: str | None = None) -> list[dict[str, Any]]:
        """The files not expired (of ``purpose``, of ``tenant``, when given), newest first."""
        return [dict(r) for r in self._query(
            f"SELECT * FROM files WHERE {LIVE} AND ? IN (purpose, '*') AND ? IN (tenant, '*') "
            "ORDER BY created_at DESC, id", (self._now(), _any(purpose), _any(tenant)))]

    def delete_file(self, file_id: str, tenant: str | None = None) -> bool:
        """Delete a file not expired (and ``tenant``'s, if given); False if there is none."""
        with self._tx() as db:
            deleted = db.execute(f"DELETE FROM files WHERE id = ? AND {LIVE} AND ? IN (tenant, '*')",
                                 (file_id, self._now(), _any(tenant))).rowcount > 0
        if deleted:
            self.file_path(file_id).unlink(missing_ok=True)
        return deleted

    def sweep(self) -> list[str]:
        """Delete every expired file, row and bytes, but the input of a batch not finished (it
        goes at a sweep after the batch ends); returns their ids. Rows first, in one transaction
        with the look at the batches (``create_batch`` checks its input in one too, so no batch
        starts on a file being swept); bytes after, as ``delete_file`` does."""
        with self._tx() as db:
            busy = {json.loads(r["data"]).get("input_file_id") for r in db.execute(
                f"SELECT data FROM batches WHERE status NOT IN ({','.join('?' * len(TERMINAL))})", tuple(TERMINAL))}
            expired = [r["id"] for r in db.execute("SELECT id FROM files WHERE expires_at <= ?", (self._now(),))
                       if r["id"] not in busy]
            db.executemany("DELETE FROM files WHERE id = ?", [(file_id,) for file_id in expired])
        for file_id in expired:
            self.file_path(file_id).unlink(missing_ok=True)
        return expired

    # -- batches -------------------------------------------------------------------------------

    def create_batch(self, batch: dict[str, Any], tenant: str = DEFAULT_TENANT) -> None:
        """Record a new batch of ``tenant``. Its ``input_file_id``, if any, must name a ``batch``
        file of that tenant, not expired (``KeyError`` if not), checked in the same transaction."""
        with self._tx() as db:
            input_file_id = batch.get("input_file_id")
            if input_file_id is not None and db.execute(
                    f"SELECT 1 FROM files WHERE id = ? AND tenant = ? AND purpose = 'batch' AND {LIVE}",
                    (input_file_id, tenant, self._now())).fetchone() is None:
                raise KeyError(input_file_id)
            db.execute("INSERT INTO batches (id, status, created_at, data, tenant) VALUES (?, ?, ?, ?, ?)",
                       (batch["id"], batch["status"], batch["created_at"], json.dumps(batch), tenant))

    def batch(self, batch_id: str, tenant: str | None = None) -> dict[str, Any] | None:
        """The Batch object as stored (``tenant``'s, if given), with ``request_counts`` counted
        from its lines."""
        rows = self._query("SELECT data FROM batches WHERE id = ? AND ? IN (tenant, '*')", (batch_id, _any(tenant)))
        if not rows:
            return None
        batch: dict[str, Any] = json.loads(rows[0]["data"])
        batch["request_counts"] = self.counts(batch_id).as_dict()
        return batch

    def batch_ids(self, statuses: tuple[str, ...] | None = None, tenant: str | None = None) -> list[str]:
        """Newest first (``tenant``'s only, if given)."""
        rows = self._query("SELECT id, status FROM batches WHERE ? IN (tenant, '*') ORDER BY created_at DESC, "
                           "rowid DESC", (_any(tenant),))
        return [r["id"] for r in rows if statuses is None or r["status"] in statuses]

    def owner(self, batch_id: str) -> str:
        """The tenant a batch (one there is) belongs to."""
        return str(self._query("SELECT tenant FROM batches WHERE id = ?", (batch_id,))[0]["tenant"])

    def update_batch(self, batch_id: str, status: str | None = None, **fields: Any) -> dict[str, Any]:
        """Set ``fields`` and move to ``status`` (checked against OpenAI's lifecycle; its
        ``*_at`` timestamp set) in one transaction; returns the new Batch object."""
        with self._tx() as db:
            row = db.execute("SELECT data FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None:
                raise KeyError(batch_id)
            batch = json.loads(row["data"])
            if status is not None and status != batch["status"]:
                check_transition(batch["status"], status)
                batch["status"] = status
                if status in TIMESTAMP_OF:
                    batch[TIMESTAMP_OF[status]] = self._now()
            batch.update(fields)
            db.execute("UPDATE batches SET status = ?, data = ? WHERE id = ?",
                       (batch["status"], json.dumps(batch), batch_id))
        return self.batch(batch_id) or batch

    # -- lines -------------------------------------------------------------------------------

    def add_lines(self, batch_id: str, lines: list[InputLine], invalid_results: dict[int, dict[str, Any]],
                  status: str = "in_progress") -> None:
        """Journal every line of a validated input (bad ones already failed, with their error
        entries) and move the batch to ``status``, in one transaction: a validation killed
        half-way left nothing, and is done again."""
        with self._tx() as db:
            db.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
            db.executemany("INSERT INTO lines (batch_id, line_no, rank, custom_id, body, state, result) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?)", [
                (batch_id, ln.line_no, ln.rank, ln.custom_id, json.dumps(ln.body) if ln.body is not None else None,
                 "pending" if ln.error is None else "failed",
                 json.dumps(invalid_results[ln.line_no]) if ln.error is not None else None) for ln in lines])
            row = db.execute("SELECT data FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is not None:
                batch = json.loads(row["data"])
                if batch["status"] != status:
                    check_transition(batch["status"], status)
                    batch["status"] = status
                    batch[TIMESTAMP_OF[status]] = self._now()
                db.execute("UPDATE batches SET status = ?, data = ? WHERE id = ?", (status, json.dumps(batch), batch_id))

    def has_lines(self, batch_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM lines WHERE batch_id = ? LIMIT 1", (batch_id,)))

    def unfinished(self, batch_id: str) -> list[tuple[int, str, dict[str, Any]]]:
        """(line_no, custom_id, body) of every line not done or failed, in run order. A line
        left ``running`` by a killed process is among them: its result was never committed."""
        rows = self._query("SELECT line_no, custom_id, body FROM lines WHERE batch_id = ? AND state IN "
                           "('pending', 'running') ORDER BY rank", (batch_id,))
        return [(r["line_no"], r["custom_id"], json.loads(r["body"])) for r in rows]

    def mark_running(self, batch_id: str, line_no: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE lines SET state = 'running' WHERE batch_id = ? AND line_no = ? AND state = 'pending'",
                       (batch_id, line_no))

    def release(self, batch_id: str, line_nos: list[int]) -> None:
        """Give lines back (``running`` -> ``pending``): a run stopped or set them aside unfinished."""
        with self._tx() as db:
            db.executemany("UPDATE lines SET state = 'pending' WHERE batch_id = ? AND line_no = ? AND state = 'running'",
                           [(batch_id, line_no) for line_no in line_nos])

    def crashes(self, batch_id: str) -> dict[int, int]:
        """line_no -> the process deaths it was in flight for, of each unfinished line that has any."""
        rows = self._query("SELECT line_no, crashes FROM lines WHERE batch_id = ? AND crashes > 0 AND state IN "
                           "('pending', 'running')", (batch_id,))
        return {r["line_no"]: r["crashes"] for r in rows}

    def finish_line(self, batch_id: str, line_no: int, state: str, result: dict[str, Any],
                    run: tuple[int, int] | None = None) -> None:
        """Commit a line's result (``done`` or ``failed``); with ``run`` = (run_no,
        tokens_computed), also the run's token count, in the same transaction."""
        assert state in ("done", "failed")
        with self._tx() as db:
            db.execute("UPDATE lines SET state = ?, result = ? WHERE batch_id = ? AND line_no = ? "
                       "AND state IN ('pending', 'running')", (state, json.dumps(result), batch_id, line_no))
            if run is not None:
                db.execute("UPDATE runs SET tokens_computed = ? WHERE batch_id = ? AND run_no = ?",
                           (run[1], batch_id, run[0]))

    def counts(self, batch_id: str) -> RequestCounts:
        rows = self._query("SELECT state, COUNT(*) AS n FROM lines WHERE batch_id = ? GROUP BY state", (batch_id,))
        by_state = {r["state"]: r["n"] for r in rows}
        return RequestCounts(sum(by_state.values()), by_state.get("done", 0), by_state.get("failed", 0))

    def results(self, batch_id: str, state: str) -> Iterator[str]:
        """The committed result lines of ``state`` (JSON text), in input order."""
        for r in self._query("SELECT result FROM lines WHERE batch_id = ? AND state = ? ORDER BY line_no",
                             (batch_id, state)):
            yield r["result"]

    # -- runs: how many tokens each process spent on a job (the bench's resume cost) ----------

    def start_run(self, batch_id: str) -> int:
        """A new run's number. The lines still ``running`` were in flight when the process running
        the last one was killed: pending again (a fault's were counted when the store opened)."""
        with self._tx() as db:
            db.execute("UPDATE lines SET state = 'pending' WHERE batch_id = ? AND state = 'running'", (batch_id,))
            run_no = db.execute("SELECT COALESCE(MAX(run_no), -1) + 1 FROM runs WHERE batch_id = ?",
                                (batch_id,)).fetchone()[0]
            db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, 0)", (batch_id, run_no, os.getpid(), time.time()))
        return int(run_no)

    def record_run(self, batch_id: str, run_no: int, tokens_computed: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE runs SET tokens_computed = ? WHERE batch_id = ? AND run_no = ?",
                       (tokens_computed, batch_id, run_no))

    def runs(self, batch_id: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self._query("SELECT * FROM runs WHERE batch_id = ? ORDER BY run_no", (batch_id,))]
