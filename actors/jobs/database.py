"""``JobDatabase``: the SQLite file (the standard library's, WAL) that holds batch jobs' files and journal.

It opens the file under an owner lock: one lock file per database (``fcntl.flock``) keeps a second
process from running the same jobs, and the kernel releases it when its holder dies. It makes the
tables, adds the columns a journal made by an older llamactor lacks, and runs each call as one
short transaction. Tenants' prompts and answers are in it: files 0600 in 0700 folders.
``UploadedFiles`` (``jobs/files.py``) and ``JobStore`` (``jobs/journal.py``) build on it.

Thread-safe: one connection, used under a lock, by whichever thread calls (the HTTP event loop's
executor, a job's runner thread, the service's sweeper thread, the CLI's main thread).
Timestamps come from ``clock`` (a fake one in tests).
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llamactor.base.private_files import open_private, private_dir, tighten_file, touch_private
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
ADDED_COLUMNS = (("files", "tenant", "TEXT NOT NULL DEFAULT 'default'"), ("files", "expires_at", "INTEGER"),
                 ("batches", "tenant", "TEXT NOT NULL DEFAULT 'default'"),
                 ("lines", "crashes", "INTEGER NOT NULL DEFAULT 0"))
LIVE = "(expires_at IS NULL OR expires_at > ?)"  # a file row not expired at the time given
# Filters by an optional argument: ``? IN (tenant, '*')`` with '*' (None) passes every row; no tenant
# name or purpose is '*'.
ANY = "*"


def or_any(value: str | None) -> str:
    """The argument of an optional filter: ``ANY`` for None (every row)."""
    return ANY if value is None else value  # "" is nobody's, not everyone's


class StoreLockedError(RuntimeError):
    """Another live process holds this store."""


class JobDatabase:
    def __init__(self, db_path: str | Path, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.db_path = Path(db_path)
        # (a journal's existing folder, the CLI's output folder, is left as it is)
        private_dir(self.db_path.parent, tighten=False)
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

    def close(self) -> None:
        with self._mutex:
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
