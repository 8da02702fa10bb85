"""``JobService``: the daemon's batch jobs: OpenAI's files and batches over a ``JobStore``.

Each unfinished job has a worker thread of its own that takes it through OpenAI's lifecycle:
validating (the input file read and journaled) -> in_progress (a ``JobRunner`` on the model)
-> finalizing (the output and error files written) -> completed; or cancelling -> cancelled (the
output of the lines already done kept), or failed (an input file that is not JSONL). Every step
is committed before the next begins, so a daemon killed at any moment resumes each job where it
stood when it starts again (``start``); cancelled and finished jobs stay as they are.

Files and batches (a batch's output and error files too) belong to the tenant that made them:
the public methods take the caller's ``tenant`` name, and another tenant's are ``NotFound`` as
an unknown id is. A tenant keeps at most its ``max_files`` files of ``max_file_bytes`` together
and runs at most ``max_batch_jobs`` jobs at once (``quotas``); a job's lines spend its requests
and tokens per minute, waiting for them when they run out (``limiter``, ``QuotaClient``). Files expire (``expires_after``, default 30 days): an expired file is gone at
once, and the sweeper thread deletes its bytes when the service starts and every
``sweep_every_s`` after, keeping the input of a batch not finished.

Methods are called from the HTTP handlers (through ``asyncio.to_thread``), the workers, and the
sweeper.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from llamactor.base.errors import InvalidRequestError, LlamactorError, ModelNotLoadedError
from llamactor.base.logging import get_logger
from llamactor.base.tenants import DEFAULT_TENANT, Tenant, tenant_named
from llamactor.handles.limits import Limiter
from llamactor.handles.model import ModelClient, check_may_load
from llamactor.handles.quota import QuotaClient
from llamactor.jobs import quotas, records
from llamactor.jobs.endpoints import check_body
from llamactor.jobs.input_lines import ENDPOINTS, NotJsonlError, read_input_lines
from llamactor.jobs.lifecycle import resumable
from llamactor.jobs.runner import JobRunner
from llamactor.jobs.store import JobStore

log = get_logger("llamactor.jobs")
PURPOSES = ("batch", "batch_output")


class NotFound(LookupError):
    """No file or batch of that id (a 404)."""


class JobService:
    """``resolve(model_name)``: the served model a body names (``ModelNotFoundError`` if none).
    ``max_in_flight``: a job's lines in flight at once (default: three quarters of the model's
    ``n_parallel``, leaving sequences free for interactive requests). ``sweep_every_s``: how
    often expired files are deleted."""

    def __init__(self, store: JobStore, max_in_flight: int | None = None, sweep_every_s: float = 3600.0) -> None:
        self.store = store
        self.max_in_flight = max_in_flight
        self.sweep_every_s = sweep_every_s
        self._stopped = threading.Event()  # close(): the sweeper's wait ends at once
        self._sweeper: threading.Thread | None = None
        self._resolve: Callable[[str | None], ModelClient] | None = None
        self._ready = threading.Event()
        # A batch's owner by name -> the tenant its lines run as (the daemon: from its keys, as they
        # stand when the job runs; else a tenant with the defaults).
        self.tenant: Callable[[str], Tenant] = tenant_named
        # The tenants' requests and tokens per minute (the daemon's, shared with interactive
        # requests): a job's lines wait for them (``QuotaClient``). None: lines are not limited.
        self.limiter: Limiter | None = None
        self._closing = False
        self._lock = threading.Lock()
        self._workers: dict[str, tuple[threading.Thread, threading.Event]] = {}

    def start(self, resolve: Callable[[str | None], ModelClient]) -> None:
        """The models are loaded: resume every unfinished job, and start the sweeper (the loader
        thread calls this)."""
        self._resolve = resolve
        self._ready.set()
        self._sweeper = threading.Thread(target=self._sweep_until_closed, name="jobs-sweeper", daemon=True)
        self._sweeper.start()
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
        self._stopped.set()
        for _, stop in workers:
            stop.set()
        for thread in [t for t, _ in workers] + ([self._sweeper] if self._sweeper else []):
            thread.join(timeout_s)
        self.store.close()

    def _sweep_until_closed(self) -> None:
        """The sweeper thread: expired files deleted now, then every ``sweep_every_s`` until ``close``."""
        while not self._stopped.is_set():
            try:
                if gone := self.store.sweep():
                    log.info("files_expired", files=len(gone), file_ids=gone[:20])
            except Exception as e:  # noqa: BLE001 - a failed sweep (disk full, ...) is retried at the next
                log.error("files_sweep_failed", error=repr(e))
            self._stopped.wait(self.sweep_every_s)

    # -- files ---------------------------------------------------------------------------------

    def add_file(self, data: bytes, filename: str, purpose: str, *, tenant: str = DEFAULT_TENANT,
                 expires_after: dict[str, Any] | None = None) -> dict[str, Any]:
        """A new file of ``tenant``; ``expires_after``: OpenAI's policy (default 30 days)."""
        if purpose != "batch":
            raise InvalidRequestError(f"purpose must be 'batch' (got {purpose!r}): llamactor keeps batch input files only")
        seconds = records.expiry_seconds(expires_after, "expires_after")
        with self._lock:  # (the check and the add together: two uploads at once cannot both pass it)
            quotas.check_new_file(self.tenant(tenant), self.store.files(None, tenant), len(data))
            return records.file_object(self.store.add_file(data, filename, purpose, tenant=tenant,
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
        self._spawn(batch_id)
        return self.get(batch_id, tenant=tenant)

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
        batch = self.get(batch_id, tenant=None)
        if batch["status"] == "validating" and not self._validate(batch):
            return
        batch = self.get(batch_id, tenant=None)
        try:
            client = self._client(batch)
        except ModelNotLoadedError as e:
            self._fail(batch_id, e.code, str(e))
            return
        if batch["status"] == "in_progress" and client is not None:
            max_in_flight = self.max_in_flight or max(1, client.config.n_parallel * 3 // 4)
            quota = client if self.limiter is None else QuotaClient(client, self.limiter, stop, batch_id)
            runner = JobRunner(self.store, batch_id, batch["endpoint"], quota, client.name,
                               max_in_flight=max_in_flight, stop=stop, tenant=self.tenant(self.store.owner(batch_id)))
            if runner.run():
                try:
                    self.store.update_batch(batch_id, "finalizing")
                except ValueError:
                    pass  # cancelled while its last line finished: finalized as cancelled below
            elif self._closing:
                return  # the daemon stops: the job resumes when it starts again
        elif batch["status"] == "in_progress":  # every line was finished before a restart
            self.store.update_batch(batch_id, "finalizing")
        batch = self.get(batch_id, tenant=None)
        if batch["status"] in ("finalizing", "cancelling"):
            self._finalize(batch)

    def _validate(self, batch: dict[str, Any]) -> bool:
        """Plan and journal the input; False when the batch failed (or was cancelled) instead."""
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
