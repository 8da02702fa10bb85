"""``JobService``: the daemon's batch jobs: OpenAI's files and batches over a ``JobStore``.

Each unfinished job has a worker thread of its own that takes it through OpenAI's lifecycle:
validating (the input file planned and journaled) -> in_progress (a ``JobRunner`` on the model)
-> finalizing (the output and error files written) -> completed; or cancelling -> cancelled (the
output of the lines already done kept), or failed (an input file that is not JSONL). Every step
is committed before the next begins, so a daemon killed at any moment resumes each job where it
stood when it starts again (``start``); cancelled and finished jobs stay as they are.

Methods are called from the HTTP handlers (through ``asyncio.to_thread``) and the workers.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from llamactor.base.errors import InvalidRequestError, LlamactorError
from llamactor.base.logging import get_logger
from llamactor.handles.model import ModelClient
from llamactor.jobs import records
from llamactor.jobs.endpoints import check_body
from llamactor.jobs.plan import ENDPOINTS, NotJsonlError, plan_lines, resumable
from llamactor.jobs.runner import JobRunner
from llamactor.jobs.store import JobStore

log = get_logger("llamactor.jobs")
PURPOSES = ("batch", "batch_output")


class NotFound(LookupError):
    """No file or batch of that id (a 404)."""


class JobService:
    """``resolve(model_name)``: the served model a body names (``ModelNotFoundError`` if none).
    ``max_in_flight``: a job's lines in flight at once (default: three quarters of the model's
    ``n_parallel``, leaving sequences free for interactive requests)."""

    def __init__(self, store: JobStore, max_in_flight: int | None = None) -> None:
        self.store = store
        self.max_in_flight = max_in_flight
        self._resolve: Callable[[str | None], ModelClient] | None = None
        self._ready = threading.Event()
        self._closing = False
        self._lock = threading.Lock()
        self._workers: dict[str, tuple[threading.Thread, threading.Event]] = {}

    def start(self, resolve: Callable[[str | None], ModelClient]) -> None:
        """The models are loaded: resume every unfinished job (the loader thread calls this)."""
        self._resolve = resolve
        self._ready.set()
        for batch_id in reversed(self.store.batch_ids()):
            batch = self.store.batch(batch_id)
            if batch is not None and resumable(batch["status"]):
                log.info("job_resumed", batch_id=batch_id, status=batch["status"],
                         request_counts=batch["request_counts"])
                self._spawn(batch_id)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the workers (their jobs stay resumable) and close the store."""
        with self._lock:
            self._closing = True
            workers = list(self._workers.values())
        self._ready.set()
        for _, stop in workers:
            stop.set()
        for thread, _ in workers:
            thread.join(timeout_s)
        self.store.close()

    # -- files ---------------------------------------------------------------------------------

    def add_file(self, data: bytes, filename: str, purpose: str) -> dict[str, Any]:
        if purpose != "batch":
            raise InvalidRequestError(f"purpose must be 'batch' (got {purpose!r}): llamactor keeps batch input files only")
        return records.file_object(self.store.add_file(data, filename, purpose))

    def file(self, file_id: str) -> dict[str, Any]:
        row = self.store.file(file_id)
        if row is None:
            raise NotFound(f"No file with id {file_id!r}")
        return records.file_object(row)

    def files(self, purpose: str | None = None) -> list[dict[str, Any]]:
        return [records.file_object(r) for r in self.store.files(purpose)]

    def file_content(self, file_id: str) -> bytes:
        self.file(file_id)
        return self.store.file_path(file_id).read_bytes()

    def delete_file(self, file_id: str) -> dict[str, Any]:
        if not self.store.delete_file(file_id):
            raise NotFound(f"No file with id {file_id!r}")
        return {"id": file_id, "object": "file", "deleted": True}

    # -- batches -------------------------------------------------------------------------------

    def create(self, input_file_id: str, endpoint: str, completion_window: str = "24h",
               metadata: dict[str, str] | None = None) -> dict[str, Any]:
        if endpoint not in ENDPOINTS:
            raise InvalidRequestError(f"endpoint must be one of {', '.join(ENDPOINTS)} (got {endpoint!r})")
        if completion_window != "24h":
            raise InvalidRequestError("completion_window must be '24h'")
        row = self.store.file(input_file_id)
        if row is None or row["purpose"] != "batch":
            raise InvalidRequestError(f"input_file_id {input_file_id!r} names no file uploaded with purpose 'batch'")
        now = int(time.time())
        batch_id = f"batch_{uuid.uuid4().hex[:24]}"
        batch: dict[str, Any] = {
            "id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None, "input_file_id": input_file_id,
            "completion_window": completion_window, "status": "validating", "output_file_id": None,
            "error_file_id": None, "created_at": now, "in_progress_at": None, "expires_at": now + 24 * 3600,
            "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
            "cancelling_at": None, "cancelled_at": None, "metadata": metadata}
        self.store.create_batch(batch)
        log.info("job_created", batch_id=batch_id, endpoint=endpoint, input_file_id=input_file_id)
        self._spawn(batch_id)
        return self.get(batch_id)

    def get(self, batch_id: str) -> dict[str, Any]:
        batch = self.store.batch(batch_id)
        if batch is None:
            raise NotFound(f"No batch with id {batch_id!r}")
        return batch

    def list_batches(self, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        ids = self.store.batch_ids()
        if after is not None:
            ids = ids[ids.index(after) + 1:] if after in ids else []
        page = [self.get(i) for i in ids[:limit]]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(ids) > limit}

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """validating / in_progress -> cancelling; its worker cancels what is in flight and
        finalizes to cancelled. A finished batch is answered as it is."""
        batch = self.get(batch_id)
        if batch["status"] in ("validating", "in_progress"):
            try:
                self.store.update_batch(batch_id, "cancelling")
            except ValueError:
                return self.get(batch_id)  # it moved on meanwhile (finalizing): too late to cancel
            with self._lock:
                worker = self._workers.get(batch_id)
            if worker is not None:
                worker[1].set()
            else:
                self._spawn(batch_id)
            log.info("job_cancelling", batch_id=batch_id)
        return self.get(batch_id)

    # -- workers -------------------------------------------------------------------------------

    def _spawn(self, batch_id: str) -> None:
        with self._lock:
            if self._closing or batch_id in self._workers:
                return
            stop = threading.Event()
            thread = threading.Thread(target=self._work, args=(batch_id, stop), name=f"job-{batch_id}", daemon=True)
            self._workers[batch_id] = (thread, stop)
        thread.start()

    def _work(self, batch_id: str, stop: threading.Event) -> None:
        """A job's worker thread: from wherever the job stands to a final status, or to ``stop``."""
        try:
            self._ready.wait()
            if not self._closing:
                self._advance(batch_id, stop)
        except Exception as e:  # noqa: BLE001 - a job's bug ends that job, visibly, not the daemon
            log.error("job_crashed", batch_id=batch_id, error=repr(e))
            self._fail(batch_id, "internal_error", f"the job failed: {e!r}")
        finally:
            with self._lock:
                self._workers.pop(batch_id, None)

    def _advance(self, batch_id: str, stop: threading.Event) -> None:
        batch = self.get(batch_id)
        if batch["status"] == "validating" and not self._validate(batch):
            return
        batch = self.get(batch_id)
        client = self._client(batch)
        if batch["status"] == "in_progress" and client is not None:
            max_in_flight = self.max_in_flight or max(1, client.config.n_parallel * 3 // 4)
            runner = JobRunner(self.store, batch_id, batch["endpoint"], client, client.name,
                               max_in_flight=max_in_flight, stop=stop)
            if runner.run():
                try:
                    self.store.update_batch(batch_id, "finalizing")
                except ValueError:
                    pass  # cancelled while its last line finished: finalized as cancelled below
            elif self._closing:
                return  # the daemon stops: the job resumes when it starts again
        elif batch["status"] == "in_progress":  # every line was finished before a restart
            self.store.update_batch(batch_id, "finalizing")
        batch = self.get(batch_id)
        if batch["status"] in ("finalizing", "cancelling"):
            self._finalize(batch)

    def _validate(self, batch: dict[str, Any]) -> bool:
        """Plan and journal the input; False when the batch failed (or was cancelled) instead."""
        batch_id = batch["id"]
        try:
            data = self.store.file_path(batch["input_file_id"]).read_bytes()
            models: list[str | None] = []
            planned = plan_lines(data, batch["endpoint"], lambda endpoint, body: self._check(endpoint, body, models))
        except NotJsonlError as e:
            self._fail(batch_id, e.code, str(e))
            return False
        except (OSError, KeyError):
            self._fail(batch_id, "missing_input_file", f"input file {batch['input_file_id']} is gone")
            return False
        invalid = {ln.line_no: records.invalid_line(batch_id, ln.line_no, ln.custom_id, *ln.error)
                   for ln in planned if ln.error is not None}
        try:
            self.store.add_lines(batch_id, planned, invalid,
                                 status="cancelling" if self.get(batch_id)["status"] == "cancelling" else "in_progress")
        except ValueError:
            return False
        self.store.update_batch(batch_id, model=models[0] if models else None)
        return True

    def _check(self, endpoint: str, body: dict[str, Any], models: list[str | None]) -> str | None:
        """The endpoint's checks, and the model: served, and the same for every line (OpenAI's rule)."""
        assert self._resolve is not None
        try:
            name = self._resolve(body.get("model")).name
        except LlamactorError as e:
            return str(e)
        if models and models[0] != name:
            return f"every line of a batch must name the same model ({models[0]}); this one names {name}"
        problem = check_body(endpoint, body)
        if problem is None and not models:
            models.append(name)
        return problem

    def _client(self, batch: dict[str, Any]) -> ModelClient | None:
        assert self._resolve is not None
        counts = self.store.counts(batch["id"])
        if counts.finished == counts.total:
            return None  # nothing left to run
        client = self._resolve(batch.get("model"))
        if not client.loaded:
            client.load()
        return client

    def _finalize(self, batch: dict[str, Any]) -> None:
        """Write the output and error files (whole, then recorded), then the final status."""
        batch_id = batch["id"]
        stem = batch_id.removeprefix("batch_")
        fields: dict[str, Any] = {}
        for state, key in (("done", "output_file_id"), ("failed", "error_file_id")):
            lines = list(self.store.results(batch_id, state))
            if lines:
                data = "".join(line + "\n" for line in lines).encode()
                kind = "output" if state == "done" else "errors"
                fields[key] = self.store.add_file(data, f"{batch_id}_{kind}.jsonl", "batch_output",
                                                  file_id=f"file-{stem}-{kind}")["id"]
        fields["usage"] = records.batch_usage(self.store.results(batch_id, "done"))
        final = "completed" if batch["status"] == "finalizing" else "cancelled"
        self.store.update_batch(batch_id, final, **fields)
        log.info("job_finished", batch_id=batch_id, status=final, **self.store.counts(batch_id).as_dict())

    def _fail(self, batch_id: str, code: str, message: str) -> None:
        errors = {"object": "list", "data": [{"code": code, "message": message, "param": None, "line": None}]}
        try:
            self.store.update_batch(batch_id, "failed", errors=errors)
        except ValueError:
            self.store.update_batch(batch_id, errors=errors)
        log.warning("job_failed", batch_id=batch_id, code=code, message=message)
