"""``JobService``: the daemon's batch jobs: OpenAI's batches (and, through ``FilesApi``, its files)
over a ``JobStore``.

Each unfinished job has a worker thread of its own that takes it through OpenAI's lifecycle:
validating (the input file read and journaled) -> in_progress (a ``JobRunner`` on the model)
-> finalizing (the output and error files written) -> completed; or cancelling -> cancelled (the
output of the lines already done kept), or failed (an input file that is not JSONL). Every step
is committed before the next begins, so a daemon killed at any moment resumes each job where it
stood when it starts again (``start``); cancelled and finished jobs stay as they are.

Batches belong to the tenant that made them: the public methods take the caller's ``tenant``
name, and another tenant's are ``NotFound`` as an unknown id is. A tenant runs at most
``max_batch_jobs`` jobs at once (``quotas``); a job's lines spend its requests and tokens per
minute, waiting for them when they run out (``limiter``, ``QuotaClient``).

Methods are called from the HTTP handlers (through ``asyncio.to_thread``), the workers (``_work``
and what it calls run on a job's own thread), and the loader thread (``start``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from llamactor.base.errors import InvalidRequestError, LlamactorError, ModelNotLoadedError
from llamactor.base.logging import get_logger
from llamactor.base.tenants import DEFAULT_TENANT
from llamactor.handles.limits import RateLimiter
from llamactor.handles.model import ModelClient, check_may_load
from llamactor.handles.quota import QuotaClient
from llamactor.jobs import quotas, records
from llamactor.jobs.endpoints import check_body
from llamactor.jobs.files_api import FilesApi, NotFound
from llamactor.jobs.input_lines import ENDPOINTS, NotJsonlError, read_input_lines
from llamactor.jobs.journal import JobStore
from llamactor.jobs.lifecycle import resumable
from llamactor.jobs.runner import JobRunner

log = get_logger("llamactor.jobs")
__all__ = ["JobService", "NotFound"]  # NotFound: the HTTP routes catch it from here


class JobService(FilesApi):
    """``resolve(model_name)``: the served model a body names (``ModelNotFoundError`` if none).
    ``max_in_flight``: a job's lines in flight at once (default: three quarters of the model's
    ``n_parallel``, leaving sequences free for interactive requests). ``sweep_every_s``: how
    often expired files are deleted."""

    def __init__(self, store: JobStore, max_in_flight: int | None = None, sweep_every_s: float = 3600.0) -> None:
        super().__init__(store, sweep_every_s)
        self.max_in_flight = max_in_flight
        self._resolve: Callable[[str | None], ModelClient] | None = None
        self._ready = threading.Event()
        # The tenants' requests and tokens per minute (the daemon's, shared with interactive
        # requests): a job's lines wait for them (``QuotaClient``). None: lines are not limited.
        self.limiter: RateLimiter | None = None
        self._closing = False
        self._workers: dict[str, tuple[threading.Thread, threading.Event]] = {}

    def start(self, resolve: Callable[[str | None], ModelClient]) -> None:
        """The models are loaded: resume every unfinished job, and start the sweeper (the loader
        thread calls this)."""
        self._resolve = resolve
        self._ready.set()
        self._start_sweeper()
        for batch_id in reversed(self.store.batch_ids()):
            batch = self.store.batch(batch_id)
            if batch is not None and resumable(batch["status"]):
                log.info("job_resumed", batch_id=batch_id, status=batch["status"],
                         request_counts=batch["request_counts"])
                self._spawn(batch_id)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the workers (their jobs stay resumable) and the sweeper, and close the store."""
        with self._lock:
            self._closing = True
            workers = list(self._workers.values())
        self._ready.set()
        for _, stop in workers:
            stop.set()
        self._stop_sweeper(timeout_s)
        for thread, _ in workers:
            thread.join(timeout_s)
        self.store.close()

    # -- batches -------------------------------------------------------------------------------

    def create(self, input_file_id: str, endpoint: str, completion_window: str = "24h",
               metadata: dict[str, str] | None = None, *, tenant: str = DEFAULT_TENANT,
               output_expires_after: dict[str, Any] | None = None) -> dict[str, Any]:
        """A batch of ``tenant`` on its input file; ``output_expires_after``: its output and error
        files' policy (default 30 days)."""
        if endpoint not in ENDPOINTS:
            raise InvalidRequestError(f"endpoint must be one of {', '.join(ENDPOINTS)} (got {endpoint!r})")
        if completion_window != "24h":
            raise InvalidRequestError("completion_window must be '24h'")
        records.expiry_seconds(output_expires_after, "output_expires_after")  # refused now, not at the end
        batch_id = f"batch_{uuid.uuid4().hex[:24]}"
        batch = records.batch_object(batch_id, input_file_id, endpoint, completion_window, int(self.store.clock()),
                                     metadata, output_expires_after)
        try:
            with self._lock:  # (the check and the create together)
                quotas.check_new_job(self.tenant(tenant), len(self.store.batch_ids(quotas.UNFINISHED, tenant)))
                self.store.create_batch(batch, tenant)
        except KeyError:  # none, expired, another tenant's: one answer, so that it tells nothing about others
            raise InvalidRequestError(f"input_file_id {input_file_id!r} names no file uploaded with purpose "
                                      "'batch'") from None
        log.info("job_created", batch_id=batch_id, endpoint=endpoint, input_file_id=input_file_id, tenant=tenant)
        # the batch as created ("validating", as OpenAI answers): read after the spawn, it would be
        # whatever the worker had done by then -- on a loaded machine, the whole job
        created = self.get(batch_id, tenant=tenant)
        self._spawn(batch_id)
        return created

    def get(self, batch_id: str, *, tenant: str | None = DEFAULT_TENANT) -> dict[str, Any]:
        """The Batch object (``tenant=None``: whoever's, for the workers)."""
        batch = self.store.batch(batch_id, tenant)
        if batch is None:
            raise NotFound(f"No batch with id {batch_id!r}")
        return batch

    def list_batches(self, limit: int = 20, after: str | None = None, *,
                     tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        ids = self.store.batch_ids(tenant=tenant)
        if after is not None:
            ids = ids[ids.index(after) + 1:] if after in ids else []
        page = [self.get(i, tenant=tenant) for i in ids[:limit]]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(ids) > limit}

    def unfinished_batches(self) -> list[dict[str, Any]]:
        """Every tenant's batches not finished, newest first (the engine's live view)."""
        batches = (self.store.batch(i) for i in self.store.batch_ids(quotas.UNFINISHED))
        return [b for b in batches if b is not None and resumable(b["status"])]

    def cancel(self, batch_id: str, *, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        """validating / in_progress -> cancelling; its worker cancels what is in flight and
        finalizes to cancelled. A finished batch is answered as it is."""
        batch = self.get(batch_id, tenant=tenant)
        if batch["status"] in ("validating", "in_progress"):
            try:
                self.store.update_batch(batch_id, "cancelling")
            except ValueError:
                return self.get(batch_id, tenant=tenant)  # it moved on meanwhile (finalizing): too late to cancel
            with self._lock:
                worker = self._workers.get(batch_id)
            if worker is not None:
                worker[1].set()
            else:
                self._spawn(batch_id)
            log.info("job_cancelling", batch_id=batch_id)
        return self.get(batch_id, tenant=tenant)

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
        """The job from the status it stands at through the ones left, each committed before the next."""
        batch = self.get(batch_id, tenant=None)
        if batch["status"] == "validating" and not self._validate(batch):
            return
        batch = self.get(batch_id, tenant=None)
        try:
            client = self._client(batch)
        except ModelNotLoadedError as e:
            self._fail(batch_id, e.code, str(e))
            return
        if batch["status"] == "in_progress" and not self._run_lines(batch, client, stop):
            return  # the daemon stops: the job resumes when it starts again
        batch = self.get(batch_id, tenant=None)
        if batch["status"] in ("finalizing", "cancelling"):
            self._finalize(batch)

    def _run_lines(self, batch: dict[str, Any], client: ModelClient | None, stop: threading.Event) -> bool:
        """Run an in_progress batch's unfinished lines on ``client`` (None: none are left), then move
        it to finalizing; False when ``stop`` ended the run because the daemon stops."""
        batch_id = batch["id"]
        if client is None:  # every line was finished before a restart
            self.store.update_batch(batch_id, "finalizing")
            return True
        max_in_flight = self.max_in_flight or max(1, client.config.n_parallel * 3 // 4)
        quota = client if self.limiter is None else QuotaClient(client, self.limiter, stop, batch_id)
        runner = JobRunner(self.store, batch_id, batch["endpoint"], quota, client.name,
                           max_in_flight=max_in_flight, stop=stop, tenant=self.tenant(self.store.owner(batch_id)))
        if not runner.run():
            return not self._closing  # else cancelled: finalized as cancelled
        try:
            self.store.update_batch(batch_id, "finalizing")
        except ValueError:
            pass  # cancelled while its last line finished: finalized as cancelled
        return True

    def _validate(self, batch: dict[str, Any]) -> bool:
        """Read and journal the input; False when the batch failed (or was cancelled) instead."""
        batch_id = batch["id"]
        try:
            data = self.store.file_path(batch["input_file_id"]).read_bytes()
            models: list[str | None] = []
            lines = read_input_lines(data, batch["endpoint"], lambda endpoint, body: self._check(endpoint, body, models))
        except NotJsonlError as e:
            self._fail(batch_id, e.code, str(e))
            return False
        except (OSError, KeyError):
            self._fail(batch_id, "missing_input_file", f"input file {batch['input_file_id']} is gone")
            return False
        invalid = {ln.line_no: records.invalid_line(batch_id, ln.line_no, ln.custom_id, *ln.error)
                   for ln in lines if ln.error is not None}
        try:
            cancelling = self.get(batch_id, tenant=None)["status"] == "cancelling"
            self.store.add_lines(batch_id, lines, invalid, status="cancelling" if cancelling else "in_progress")
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
            check_may_load(client, self.tenant(self.store.owner(batch["id"])))  # as the owner's own request would
            client.load()
        return client

    def _finalize(self, batch: dict[str, Any]) -> None:
        """Write the output and error files (whole, then recorded), then the final status."""
        batch_id = batch["id"]
        stem = batch_id.removeprefix("batch_")
        fields: dict[str, Any] = {}
        owner = self.store.owner(batch_id)  # the output is the batch's tenant's, and lives as it asked
        seconds = records.expiry_seconds(batch.get("output_expires_after"), "output_expires_after")
        for state, key in (("done", "output_file_id"), ("failed", "error_file_id")):
            lines = list(self.store.results(batch_id, state))
            if lines:
                data = "".join(line + "\n" for line in lines).encode()
                kind = "output" if state == "done" else "errors"
                fields[key] = self.store.add_file(data, f"{batch_id}_{kind}.jsonl", "batch_output",
                                                  file_id=f"file-{stem}-{kind}", tenant=owner,
                                                  expires_after_s=seconds)["id"]
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
