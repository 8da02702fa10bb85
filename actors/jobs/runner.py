"""``JobRunner``: runs a batch job's unfinished lines on a model, journaling each result.

At most ``max_in_flight`` lines are in flight at once (so a job never fills the batcher's queue,
and leaves sequences free for interactive callers), taken in the input's run order (lines that
share a prefix together). While other callers have work on the model (``InteractiveWatch``: the
model's running and waiting sequences beyond the job's own, seen for a while), the job keeps at
most ``yield_in_flight`` lines in flight: on a CPU every sequence in a step makes the step
slower, so an interactive request's first token waits less behind a small job than a full one. A line counts only once its result is committed to the ``JobStore``;
a process killed mid-job leaves the lines it had in flight pending, and the next run does them.
Refusals that say "later" (queue full, batcher restarting) are retried; a request the model
refuses (bad grammar, prompt too long) is a failed line in the error file, and the job goes on.

A line in flight when a process died (the journal counts it, ``JobStore.start_run``) is a
suspect: the next run does its suspects first, one at a time, so that a line that kills the
process again dies alone; one in flight at two deaths is failed (``PoisonRequestError``, once,
``job_line_quarantined``), never replayed a third time. (A poison that only crashes the batcher
is quarantined by the model's supervisor the same way, and fails its line.)

``run()`` blocks the calling thread (the CLI's main thread, a daemon job's own thread) and
returns when every line is finished or ``stop`` is set; it cancels what it had in flight then.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llamactor.base.errors import (
    BatcherRestartedError,
    BatcherUnavailableError,
    CancelledError,
    LlamactorError,
    PoisonRequestError,
    QueueFullError,
)
from llamactor.base.logging import get_logger
from llamactor.base.tenants import DEFAULT, Tenant
from llamactor.base.trace_spans import DIALECT
from llamactor.handles.client import Client
from llamactor.handles.model import ModelClient
from llamactor.handles.llm import LLM
from llamactor.jobs import records
from llamactor.jobs.endpoints import PendingLine, start_line
from llamactor.jobs.lifecycle import RequestCounts
from llamactor.jobs.journal import JobStore
from llamactor.scheduling.interactive_watch import InteractiveWatch

log = get_logger("llamactor.jobs")
RETRYABLE = (QueueFullError, BatcherUnavailableError, BatcherRestartedError)
Line = tuple[int, str, dict[str, Any], int]  # line_no, custom_id, body, attempts so far
MAX_ATTEMPTS = 8  # a line refused "for now" this often fails (the batcher is not coming back)


@dataclass(frozen=True, slots=True)
class LineCounts(RequestCounts):
    """Where a job stands: its request counts, and ``tokens`` and ``elapsed_s`` of this run only
    (for tok/s)."""

    tokens: int
    elapsed_s: float


ModelLoad = Callable[[], tuple[int, int]]  # (sequences running or waiting, decode steps so far)


def sequences_on(client: Client) -> ModelLoad | None:
    """The load of ``client``'s model, as last published (never waits)."""
    if isinstance(client, LLM):
        return lambda: _load([client.published_stats()])
    if isinstance(client, ModelClient):
        return lambda: _load(client.replica_stats()) if client.loaded else (0, 0)
    return None


def _load(stats: list[dict[str, Any]]) -> tuple[int, int]:
    return (sum(int(s.get("running") or 0) + int(s.get("pending") or 0) for s in stats),
            sum(int(s.get("steps") or 0) for s in stats))


class JobRunner:
    def __init__(self, store: JobStore, batch_id: str, endpoint: str, client: Client, model_name: str, *,
                 max_in_flight: int, stop: threading.Event | None = None,
                 on_progress: Callable[[LineCounts], None] | None = None,
                 tokens_computed: Callable[[], int] | None = None, yield_in_flight: int | None = None,
                 model_load: ModelLoad | None = None, watch: InteractiveWatch | None = None,
                 tenant: Tenant = DEFAULT) -> None:
        """``yield_in_flight``: the most lines in flight while others have work (default a quarter
        of ``max_in_flight``); ``model_load``: the model's running + waiting sequences and its step count (default:
        ``sequences_on(client)``; embedding jobs are not throttled); ``tenant``: whose job (its lines
        run as that tenant's requests)."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.yield_in_flight = max(1, min(yield_in_flight or max_in_flight // 4, max_in_flight))
        self.model_load = None if endpoint == "/v1/embeddings" else (model_load or sequences_on(client))
        self._watch = watch or InteractiveWatch()
        self.store, self.batch_id, self.endpoint = store, batch_id, endpoint
        self.client, self.model_name, self.max_in_flight = client, model_name, max_in_flight
        self.tenant = tenant
        self.stop = stop or threading.Event()
        self.on_progress = on_progress
        self.tokens_computed = tokens_computed
        self._tokens = 0
        self._start = time.monotonic()
        self._run_no = -1
        self._base = 0  # the tokens_computed() reading when this run began
        self._suspects: set[int] = set()  # lines in flight at one process death: run first, alone

    def run(self) -> bool:
        """Run until every line is finished (True) or ``stop`` is set (False). The lines' trace
        spans say dialect "batch" (docs/operations.md, *Traces*)."""
        dialect = DIALECT.set("batch")
        try:
            return self._run_lines()
        finally:
            DIALECT.reset(dialect)

    def _run_lines(self) -> bool:
        self._start = time.monotonic()
        self._run_no = self.store.start_run(self.batch_id)
        self._base = self.tokens_computed() if self.tokens_computed else 0
        todo = self._todo()
        log.info("job_running", batch_id=self.batch_id, unfinished=len(todo), max_in_flight=self.max_in_flight,
                 run=self._run_no)
        in_flight: dict[int, tuple[Line, PendingLine]] = {}  # by line_no, oldest first
        self._report()
        last_record = time.monotonic()
        while todo or in_flight:
            if self.stop.is_set():
                self._stop_in_flight(in_flight, todo)
                return False
            cap = self._cap(in_flight)
            if len(in_flight) > cap:
                self._step_aside(in_flight, todo, cap)
            self._start_lines(todo, in_flight, cap)
            futures = [f for _, pending in in_flight.values() for f in pending.futures]
            if futures:
                concurrent.futures.wait(futures, timeout=0.25, return_when=concurrent.futures.FIRST_COMPLETED)
            ended = [n for n, (_, p) in in_flight.items() if p.done()]
            self._saw_end([in_flight[n][1] for n in ended])
            for line_no in ended:
                self._finish(*in_flight.pop(line_no), todo)
            if self.tokens_computed and time.monotonic() - last_record > 0.5:
                self.store.record_run(self.batch_id, self._run_no, self.tokens_computed() - self._base)
                last_record = time.monotonic()
        return True

    def _start_lines(self, todo: deque[Line], in_flight: dict[int, tuple[Line, PendingLine]], cap: int) -> None:
        """Start lines from ``todo`` until ``cap`` are in flight; a refusal that says "later" ends
        the round (the line queued again first)."""
        while todo and len(in_flight) < cap:
            line = todo.popleft()
            line_no, custom_id, body, attempt = line
            try:
                pending = start_line(self.client, self.endpoint, body, records.request_id(self.batch_id, line_no),
                                     self.model_name, self.tenant)
            except RETRYABLE as e:
                self._retry_later(todo, (line_no, custom_id, body, attempt + 1), e, wait=not in_flight)
                return
            except Exception as e:  # noqa: BLE001 - refused before queueing: this line failed
                self._fail(line_no, custom_id, e)
                continue
            self.store.mark_running(self.batch_id, line_no)
            in_flight[line_no] = (line, pending)

    def _stop_in_flight(self, in_flight: dict[int, tuple[Line, PendingLine]], todo: deque[Line]) -> None:
        """``stop`` is set: cancel the lines in flight and give them back, unfinished, for the next run."""
        for _, pending in in_flight.values():
            pending.cancel()
        self.store.release(self.batch_id, list(in_flight))  # not in flight at a crash: no suspects
        log.info("job_stopped", batch_id=self.batch_id, in_flight=len(in_flight), left=len(todo))

    def _todo(self) -> deque[Line]:
        """The unfinished lines in run order, the suspects first; those in flight at two process
        deaths failed instead."""
        crashes = self.store.crashes(self.batch_id)
        suspects: list[Line] = []
        rest: list[Line] = []
        for line_no, custom_id, body in self.store.unfinished(self.batch_id):
            n = crashes.get(line_no, 0)
            if n >= 2:
                log.error("job_line_quarantined", batch_id=self.batch_id, line_no=line_no, custom_id=custom_id,
                          crashes=n, tenant=self.tenant.name)
                self._fail(line_no, custom_id, PoisonRequestError(
                    f"line {line_no} was in flight each time llamactor died running this job ({n} times): "
                    "it is not retried"))
            else:
                (suspects if n else rest).append((line_no, custom_id, body, 0))
        self._suspects = {line[0] for line in suspects}
        return deque(suspects + rest)

    def _cap(self, in_flight: dict[int, tuple[Line, PendingLine]]) -> int:
        """How many lines may be in flight now: one while suspects run, fewer while other callers
        have work."""
        if self._suspects:
            return 1
        if self.model_load is None:
            return self.max_in_flight
        # (a line already done but not yet finished here is still ours: it is told to the watch next)
        ours = sum(len(pending.futures) for _, pending in in_flight.values())
        load, steps = self.model_load()
        if self._watch.observe(load - ours, steps, time.monotonic()):
            return self.yield_in_flight
        return self.max_in_flight

    def _saw_end(self, pending: list[PendingLine]) -> None:
        """Tell the watch how many of the job's sequences just ended, and how old the stats are now."""
        if pending and self.model_load is not None:
            self._watch.saw_end(sum(len(p.futures) for p in pending), self.model_load()[1])

    def _step_aside(self, in_flight: dict[int, tuple[Line, PendingLine]], todo: deque[Line], cap: int) -> None:
        """Cancel the newest lines beyond ``cap`` (the least generated, so the least lost: their
        prompts stay in the prefix cache) and queue them again first: sequences the scheduler
        would not free before they finish go to the callers who are waiting now."""
        newest = list(in_flight)[cap:]
        cancelled: list[PendingLine] = []
        for line_no in reversed(newest):
            line, pending = in_flight.pop(line_no)
            pending.cancel()
            todo.appendleft(line)
            cancelled.append(pending)
        self._saw_end(cancelled)
        self.store.release(self.batch_id, newest)
        log.info("job_stepped_aside", batch_id=self.batch_id, lines=len(newest), in_flight=cap)

    def _finish(self, line: Line, pending: PendingLine, todo: deque[Line]) -> None:
        line_no, custom_id, body_in, attempt = line
        try:
            body = pending.response_body()
        except RETRYABLE as e:
            self._retry_later(todo, (line_no, custom_id, body_in, attempt + 1), e, wait=False)
            return
        except CancelledError as e:
            if self.stop.is_set():
                return  # ours: the line stays unfinished for the next run
            self._fail(line_no, custom_id, e)
            return
        except Exception as e:  # noqa: BLE001 - the request failed: this line failed
            self._fail(line_no, custom_id, e)
            return
        self._tokens += int(body.get("usage", {}).get("completion_tokens", 0) or 0)
        self._suspects.discard(line_no)
        self.store.finish_line(self.batch_id, line_no, "done",
                               records.success_line(self.batch_id, line_no, custom_id, body), self._run())
        self._report()

    def _retry_later(self, todo: deque[Line], line: Line, error: Exception, *, wait: bool) -> None:
        if line[3] >= MAX_ATTEMPTS:
            self._fail(line[0], line[1], error)
            return
        todo.appendleft(line)
        if wait:  # nothing in flight to wait for: back off before asking again
            self.stop.wait(min(0.1 * 2 ** line[3], 5.0))

    def _fail(self, line_no: int, custom_id: str, error: Exception) -> None:
        self._suspects.discard(line_no)
        if isinstance(error, LlamactorError):
            status = error.http_status if error.http_status < 500 or error.http_status == 503 else 500
            type_, code = ("invalid_request_error" if status == 400 else error.code), error.code
        else:
            status, type_, code = 500, "server_error", None
        log.info("job_line_failed", batch_id=self.batch_id, line_no=line_no, status=status, error=str(error))
        self.store.finish_line(self.batch_id, line_no, "failed", records.failed_request_line(
            self.batch_id, line_no, custom_id, status, str(error) or type(error).__name__, type_, code), self._run())
        self._report()

    def _run(self) -> tuple[int, int] | None:
        return (self._run_no, self.tokens_computed() - self._base) if self.tokens_computed else None

    def _report(self) -> None:
        if self.on_progress is None:
            return
        counts = self.store.counts(self.batch_id)
        self.on_progress(LineCounts(counts.total, counts.completed, counts.failed, self._tokens,
                                  time.monotonic() - self._start))
