"""``JobStore``: batch jobs' journal: every batch, every line's state and result, every run,
in the ``JobDatabase`` (SQLite, WAL), beside the ``UploadedFiles`` it reads and writes.

Every line of a job has a row: pending -> running -> done / failed, with its output-file entry.
A result is committed before it counts, so a process killed at any moment (``kill -9``) loses at
most the requests it had in flight, and a restart runs exactly the lines not done. A line is
``running`` only while a process has it in flight (a run that stops gives its lines back,
``release``). A process that dies of a fault (SIGSEGV, SIGABRT: a native crash, which one line
can cause) writes its traceback to ``<journal>.faults`` (``faulthandler``); the next store opened
on the journal logs it and counts a crash against each line left ``running`` (``crashes``), and
the runner fails a line counted twice instead of replaying it for ever. A process killed
(SIGKILL, the OOM killer, a power loss) writes nothing: its lines are given back uncounted,
since the kill was not theirs. Batches belong to a tenant (a ``tenant=None`` argument: any
owner, for the service's workers and the CLI).

Thread-safe as the ``JobDatabase`` is: each call is one short transaction, from whichever thread
calls (the HTTP event loop's executor, a job's runner thread, the service's workers, the CLI's
main thread).
"""

from __future__ import annotations

import faulthandler
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llamactor.base.logging import get_logger
from llamactor.base.private_files import private_dir
from llamactor.base.tenants import DEFAULT_TENANT
from llamactor.jobs.database import LIVE, or_any
from llamactor.jobs.files import UploadedFiles
from llamactor.jobs.input_lines import InputLine
from llamactor.jobs.lifecycle import TIMESTAMP_OF, RequestCounts, check_transition

log = get_logger("llamactor.jobs")


def _move(batch: dict[str, Any], status: str, now: int) -> None:
    """Move a Batch object to ``status`` (checked against OpenAI's lifecycle; its ``*_at``
    timestamp set); nothing if it is there already."""
    if status != batch["status"]:
        check_transition(batch["status"], status)
        batch["status"] = status
        if status in TIMESTAMP_OF:
            batch[TIMESTAMP_OF[status]] = now


def _line_row(batch_id: str, line: InputLine, invalid_results: dict[int, dict[str, Any]]) -> tuple[Any, ...]:
    """A line's row: pending with its body, or failed with its error entry."""
    if line.error is not None:
        return (batch_id, line.line_no, line.rank, line.custom_id, None, "failed",
                json.dumps(invalid_results[line.line_no]))
    return (batch_id, line.line_no, line.rank, line.custom_id, json.dumps(line.body), "pending", None)


class JobStore(UploadedFiles):
    """``files_dir``: the uploaded files' folder (None: a journal that keeps no files, the CLI's)."""

    def __init__(self, db_path: str | Path, files_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(db_path, files_dir, clock)
        self._watch_faults()

    @classmethod
    def in_data_dir(cls, data_dir: str | Path) -> JobStore:
        """The daemon's store: ``<data_dir>/jobs.sqlite3`` and ``<data_dir>/files/``."""
        return cls(private_dir(data_dir) / "jobs.sqlite3", cls.files_dir_of(data_dir))

    @staticmethod
    def files_dir_of(data_dir: str | Path) -> Path:
        """The daemon's files folder in ``data_dir``."""
        return Path(data_dir) / "files"

    def close(self) -> None:
        faulthandler.disable()
        if self._faulthandler_was_enabled:
            faulthandler.enable()  # to stderr, as it was (python -X faulthandler, pytest)
        self._faults.close()
        super().close()

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
        rows = self._query("SELECT data FROM batches WHERE id = ? AND ? IN (tenant, '*')", (batch_id, or_any(tenant)))
        if not rows:
            return None
        batch: dict[str, Any] = json.loads(rows[0]["data"])
        batch["request_counts"] = self.counts(batch_id).as_dict()
        return batch

    def batch_ids(self, statuses: tuple[str, ...] | None = None, tenant: str | None = None) -> list[str]:
        """Newest first (``tenant``'s only, if given)."""
        rows = self._query("SELECT id, status FROM batches WHERE ? IN (tenant, '*') ORDER BY created_at DESC, "
                           "rowid DESC", (or_any(tenant),))
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
            if status is not None:
                _move(batch, status, self._now())
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
                           "VALUES (?, ?, ?, ?, ?, ?, ?)", [_line_row(batch_id, ln, invalid_results) for ln in lines])
            row = db.execute("SELECT data FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is not None:
                batch = json.loads(row["data"])
                _move(batch, status, self._now())
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
