"""The supervisor actor: starts the batcher, restarts it when it dies, loses nothing queued.

Every request passes through here on its way to the batcher and stays in ``inflight`` until its
future is done, so when a batcher dies the supervisor can replay what it held on the next one:
a generation resumes from the checkpoint its reply channel carries (prompt and generated token
ids, sampler state: ``Progress``), so a stream goes on with its next piece and a plain request
completes as if nothing happened; the callers never notice but for the delay. Restarts back off
exponentially; more than ``max_restarts`` within ``restart_window_s`` and it gives up: every
caller, streams included, then gets ``BatcherUnavailableError``.

A ``Cancel`` goes on to the batcher that runs the request, which answers it with the partial
completion. One that finds no batcher to take it (during the back-off) or that went to a batcher
which died before it handled it is answered here instead, with a ``CancelledError`` without a
completion, and the request is not replayed: a cancel is never lost to a restart.

Erlang's lesson: a message that kills its process again when it is replayed is a poison, and
replaying it for ever spends the restart budget for everyone. ``BatcherFailed`` names the
requests the batcher was handling when it died (``suspects``: the message in hand, or the
sequences of the step that failed; none for a failure that was no request's, such as
``InjectCrash``). A suspect is not replayed with the others: it is held back on probation and
the suspects are replayed one at a time, the next once the one before is done. So a second
crash has at most one suspect on probation in it, and a request suspected of two crashes is
quarantined -- failed with ``PoisonRequestError`` (422), logged once (``request_quarantined``
with its id and tenant), never replayed a third time. The innocent requests that shared the
first crash's step wait their turn instead of being quarantined with it; those that shared the
second's become suspects of one crash, and go on probation in turn. One poison costs two
restarts, never the whole budget. A watchdog trip counts as any crash does (a request whose
step hangs twice is quarantined); an injected crash names no suspect. (Most failures never come
here: the batcher fails a request whose own work raised, alone, and goes on --
``llamactor.tree.request_state.request_error``.)

It never asks the batcher anything: its own state and counters go to the tree's ``StatsBoard``
as they change, so health checks and stats never hold up request forwarding.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pykka

from llamactor.base.logging import get_logger
from llamactor.base.config import Config
from llamactor.base.errors import BatcherUnavailableError, CancelledError, ModelLoadError, PoisonRequestError
from llamactor.tree.board import StatsBoard
from llamactor.base.messages import (
    BatcherFailed,
    BatcherReady,
    Cancel,
    Forget,
    Embed,
    Generate,
    CallerMessage,
    Tokenize,
    RestartBatcher,
)
from llamactor.tree.tell import tell_quietly

log = get_logger("llamactor.supervisor")


BatcherFactory = Callable[..., pykka.ActorRef[Any]]


class SupervisorActor(pykka.ThreadingActor):
    """``start_batcher(config, model_path, supervisor_ref, generation, watchdog_trips, board, tiers)``
    starts a batcher actor (``BatcherActor.start``; passed in so that importing the caller side
    never loads llama.cpp). ``tiers``: the tree's lower cache tiers (opaque here), handed to every
    generation so that a restarted batcher finds what its predecessor cached.

    Its own state is touched by the supervisor thread only. Other threads only ``tell`` it: callers
    (requests, ``Cancel``), batchers (``BatcherReady``, ``BatcherFailed``), the thread that completes
    a request's future (``Forget``) and the back-off timer's thread (``RestartBatcher``)."""

    use_daemon_thread = True  # a program that never closes its tree still exits (``handles/llm.py``)

    def __init__(self, config: Config, model_path: str, start_batcher: BatcherFactory,
                 board: StatsBoard | None = None, tiers: Any = None) -> None:
        super().__init__()
        self.config = config
        self.model_path = model_path
        self.start_batcher = start_batcher
        self.board = board if board is not None else StatsBoard()
        self.tiers = tiers
        self.inflight: dict[str, CallerMessage] = {}
        # In-flight requests whose Cancel went to the batcher: if it dies before answering them,
        # they are cancelled here rather than replayed (a dead batcher's inbox is dropped).
        self.cancelled: set[str] = set()
        # Quarantine: crashes each in-flight request was a suspect of; the suspects held back
        # after a crash (in order), and the one of them now replayed on probation.
        self.suspected: dict[str, int] = {}
        self.probation: dict[str, None] = {}
        self.probe: str | None = None
        self.n_quarantined = 0
        self.batcher: pykka.ActorRef[Any] | None = None
        self.generation = 0
        self.restart_times: deque[float] = deque()
        self.n_restarts = 0
        self.n_watchdog_trips = 0
        self.state = "starting"  # starting | ready | restarting | failed | stopped
        self.info: Any = None
        self.failure_reason: str | None = None
        self.load_error: ModelLoadError | None = None  # why the first batcher did not start, if the model's
        self.ready = threading.Event()  # set once the first batcher is up, or start has failed
        self._restart_timer: threading.Timer | None = None

    # -- lifecycle (supervisor thread) ------------------------------------------------------

    def on_start(self) -> None:
        self._start_batcher()

    def on_stop(self) -> None:
        if self._restart_timer is not None:
            self._restart_timer.cancel()
        if self.batcher is not None:
            self.batcher.stop(block=True)
        self._set_state("stopped")
        self._fail_all(BatcherUnavailableError("llamactor was closed before this request finished"))
        self.ready.set()

    def on_failure(self, exception_type: Any, exception_value: BaseException | None, traceback: Any) -> None:
        """A bug in the supervisor itself: nobody can restart anything, so end every caller's wait."""
        log.error("supervisor_failed", error=repr(exception_value))
        self.on_stop()

    def _start_batcher(self) -> None:
        self.generation += 1
        self.batcher = self.start_batcher(self.config, self.model_path, self.actor_ref, self.generation,
                                          self.n_watchdog_trips, self.board, self.tiers)
        self.board.batcher_ref = self.batcher
        self.probe = None
        for msg in self.inflight.values():  # replay in submission order, the suspects held back
            if msg.request_id not in self.probation:
                tell_quietly(self.batcher, msg)
        self._next_probe()

    def _next_probe(self) -> None:
        """Replay the first suspect held back, alone, unless one is on probation already."""
        if self.batcher is None or self.probe is not None or not self.probation:
            return
        self.probe = next(iter(self.probation))
        tell_quietly(self.batcher, self.inflight[self.probe])

    # -- messages (supervisor thread) -------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, (Generate, Embed, Tokenize)):
            self._on_generate(message)
        elif isinstance(message, Cancel):
            self._on_cancel(message)
        elif isinstance(message, Forget):
            self.inflight.pop(message.request_id, None)
            self.cancelled.discard(message.request_id)
            self._acquit(message.request_id)
        elif isinstance(message, BatcherReady):
            if message.generation == self.generation:
                self.info = message.info
                self._set_state("ready")
                self.ready.set()
        elif isinstance(message, BatcherFailed):
            self._on_batcher_failed(message)
        elif isinstance(message, RestartBatcher):
            if message.generation == self.generation and self.state == "restarting":
                self._start_batcher()
        else:
            raise TypeError(f"supervisor got an unknown message: {message!r}")
        self._publish()
        return None

    def _on_generate(self, msg: CallerMessage) -> None:
        if self.state in ("failed", "stopped"):
            msg.reply.fail(BatcherUnavailableError(f"the batcher is not running ({self.failure_reason})"))
            return
        self.inflight[msg.request_id] = msg
        me, forget = self.actor_ref, Forget(msg.request_id)

        def forget_when_done(_: object) -> None:  # any thread: the one that completed the future
            tell_quietly(me, forget)
        msg.reply.future.add_done_callback(forget_when_done)
        if self.batcher is not None:
            # A batcher that just died raises ActorDeadError here; the request stays in
            # inflight and is replayed when its BatcherFailed arrives and a new one starts.
            tell_quietly(self.batcher, msg)

    def _acquit(self, request_id: str) -> None:
        """``request_id`` is done (or gone): off probation; the next suspect goes."""
        self.suspected.pop(request_id, None)
        self.probation.pop(request_id, None)
        if self.probe == request_id:
            self.probe = None
            self._next_probe()

    def _on_cancel(self, msg: Cancel) -> None:
        if msg.request_id in self.probation and msg.request_id != self.probe:
            self._cancel_here(msg.request_id)  # held back: no batcher has it to answer the cancel
            return
        if self.batcher is not None:
            # The batcher holds the request's partial completion, so it answers the cancel. It may
            # die first; then ``_on_batcher_failed`` cancels the request instead of replaying it.
            if msg.request_id in self.inflight:
                self.cancelled.add(msg.request_id)
            tell_quietly(self.batcher, msg)
            return
        # No batcher: the back-off between BatcherFailed and RestartBatcher (or after giving up,
        # when nothing is in flight). Told to nobody, the cancel would be lost and the request
        # replayed on the next batcher, so it ends here.
        self._cancel_here(msg.request_id)

    def _cancel_here(self, request_id: str) -> None:
        """End an in-flight request with ``CancelledError`` without a completion: what it generated
        is known only to the batcher that died (its checkpoint holds token ids, not text)."""
        self.cancelled.discard(request_id)
        req = self.inflight.pop(request_id, None)
        self._acquit(request_id)
        if req is not None:
            req.reply.fail(CancelledError(f"request {request_id} was cancelled"))

    def _on_batcher_failed(self, msg: BatcherFailed) -> None:
        if msg.generation != self.generation or self.state in ("failed", "stopped"):
            return
        self.batcher = self.board.batcher_ref = None
        for request_id in list(self.cancelled):  # cancels the dead batcher never answered
            self._cancel_here(request_id)
        self.board.batcher = {}  # the dead batcher's counters; the next one publishes its own
        self.n_watchdog_trips += msg.watchdog
        if self.info is None:  # it never came up: a bad model path will not heal by retrying
            self.load_error = msg.load_error
            self._give_up(f"the model could not be loaded: {msg.reason}")
            return
        n_quarantined = self._suspect(msg)
        now = time.monotonic()
        self.restart_times.append(now)
        while self.restart_times and now - self.restart_times[0] > self.config.restart_window_s:
            self.restart_times.popleft()
        if len(self.restart_times) > self.config.max_restarts:
            self._give_up(f"the batcher failed {len(self.restart_times)} times in "
                          f"{self.config.restart_window_s:g}s; last: {msg.reason}")
            return
        self.n_restarts += 1
        self._set_state("restarting")
        delay = min(0.05 * 2 ** (len(self.restart_times) - 1), 5.0)
        log.warning("batcher_restarting", generation=self.generation, delay_s=delay, reason=msg.reason,
                    requests_replayed=len(self.inflight) - len(self.probation), held_back=len(self.probation),
                    quarantined=n_quarantined,
                    streams_resumed=sum(1 for r in self.inflight.values() if r.reply.n_pieces_sent))
        self._restart_timer = threading.Timer(delay, tell_quietly, (self.actor_ref, RestartBatcher(self.generation)))
        self._restart_timer.daemon = True
        self._restart_timer.start()

    def _suspect(self, msg: BatcherFailed) -> int:
        """Count the crash against each in-flight suspect: a second one quarantines it, a first
        one holds it back for probation. Returns how many were quarantined."""
        quarantined = 0
        self.probe = None  # the batcher that ran it is gone; probation starts again with the first
        for request_id in msg.suspects:
            if request_id not in self.inflight:
                continue
            n = self.suspected[request_id] = self.suspected.get(request_id, 0) + 1
            if n < 2:
                self.probation.setdefault(request_id, None)
                continue
            req = self.inflight.pop(request_id)
            self._acquit(request_id)
            self.n_quarantined += 1
            quarantined += 1
            tenant = getattr(req, "tenant", None)  # a Tokenize has none
            log.error("request_quarantined", request_id=request_id, tenant=getattr(tenant, "name", None),
                      kind=type(req).__name__, crashes=n, reason=msg.reason)
            req.reply.fail(PoisonRequestError(
                f"request {request_id} was being handled each time the model's batcher crashed ({n} times): "
                "it is not retried; the server log has the details"))
        return quarantined

    def _give_up(self, reason: str) -> None:
        log.error("supervisor_gave_up", reason=reason)
        self.failure_reason = reason
        self._set_state("failed")  # published before any caller hears of it
        self._fail_all(BatcherUnavailableError(reason))
        self.ready.set()

    def _fail_all(self, error: Exception) -> None:
        for req in self.inflight.values():
            req.reply.fail(error)
        self.inflight.clear()
        self.cancelled.clear()
        self.suspected.clear()
        self.probation.clear()
        self.probe = None

    def _set_state(self, state: str) -> None:
        self.state = state
        self._publish()

    def _publish(self) -> None:
        self.board.supervisor = {"state": self.state, "restarts": self.n_restarts,
                                 "watchdog_trips": self.n_watchdog_trips, "inflight": len(self.inflight),
                                 "quarantined": self.n_quarantined}
