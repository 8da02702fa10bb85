"""``start_tree()`` and the ``LLM`` handle it returns: one model, one actor tree.

Every method runs on the caller's thread (or event loop); nothing here touches llama.cpp. Requests
go to the supervisor, told and never waited on (``send``, ``cancel``). Two methods reach the
batcher itself, through the reference the stats board publishes: ``stats`` asks it (and waits for
the step in progress), ``inject_crash`` tells it. ``close`` stops the supervisor and waits for it.
Safe from any number of threads and event loops at once.

A program that never closes its trees still exits: the actors run on daemon threads (nothing
waits for them), and an ``atexit`` hook, which runs on the main thread once it is done and before
the interpreter tears down, stops every tree still running, each as ``close`` would.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import threading
from pathlib import Path
from typing import Any, cast

import pykka

from llamactor.base.completion import Completion
from llamactor.base.config import Config
from llamactor.base.sampling import SamplingParams
from llamactor.base.engine_info import EngineInfo
from llamactor.base.sampling_defaults import model_sampling
from llamactor.base.tool_format import ToolCallFormat
from llamactor.base.errors import BatcherUnavailableError, ModelLoadError
from llamactor.base.messages import CallerMessage, Cancel, Embed, Generate, GetStats, InjectCrash
from llamactor.base.models import resolve_model_path
from llamactor.handles import tracing
from llamactor.handles.client import Client
from llamactor.tree.board import StatsBoard
from llamactor.tree.supervisor import SupervisorActor


# The supervisors of the trees started and not yet closed (any thread adds or removes one).
_running: set[pykka.ActorRef[Any]] = set()
EXIT_STOP_S = 30.0  # how long the exit hook waits for a tree's step in progress and its stop


@atexit.register
def _stop_running_trees() -> None:
    """Stop the trees a program left running (main thread, at exit)."""
    for supervisor in list(_running):
        try:
            supervisor.stop(block=True, timeout=EXIT_STOP_S)
        except Exception:  # noqa: BLE001 - already stopped, or stuck: the process exits regardless
            pass
    _running.clear()


def start_tree(config: Config, start_timeout_s: float = 300.0) -> LLM:
    """Start one supervisor (and its batcher) for ``config``; block until its model is loaded."""
    # The batcher side (llama.cpp, torch) loads only when a tree starts: `import llamactor`, the
    # HTTP app and the Ray ingress never decode and never load it.
    from llamactor.tree.batcher import BatcherActor
    from llamactor.tree.tiers.ram import CacheTiers

    tracing.configure(config.otlp_endpoint)  # TracingUnavailableError now, before the model loads
    board = StatsBoard()
    model_path = resolve_model_path(config.model)
    tiers = CacheTiers.for_config(config, model_path)  # outlives each batcher: a restart finds its prefixes warm
    supervisor = SupervisorActor.start(config, model_path, BatcherActor.start, board, tiers)
    proxy = supervisor.proxy()
    if not proxy.ready.get().wait(start_timeout_s):
        supervisor.stop()
        raise ModelLoadError(f"the model did not load within {start_timeout_s:g}s")
    if proxy.state.get() != "ready":
        reason, load_error = proxy.failure_reason.get(), proxy.load_error.get()
        supervisor.stop()
        raise load_error or ModelLoadError(reason or "the batcher could not start")
    _running.add(supervisor)
    return LLM(supervisor, config, proxy.info.get(), board)


class LLM(Client):
    """A handle on one running actor tree (the request API: ``Client``). Use as a context
    manager, or call ``close()``.

    Its public surface for other layers (``Replicas``, the Ray replica, the HTTP app): ``send``
    a message, ``cancel`` a request, ``stats`` (exact) or ``published_stats`` (never waits),
    ``info``, ``config``, ``close``."""

    def __init__(self, supervisor: pykka.ActorRef[Any], config: Config, info: EngineInfo,
                 board: StatsBoard) -> None:
        self._supervisor = supervisor
        self._board = board
        self.config = config
        self.info = info
        self._lock = threading.Lock()
        self._pending: set[concurrent.futures.Future[Completion]] = set()
        self._closing = False

    def tool_format(self) -> ToolCallFormat:
        return self.info.tool_format

    @functools.cached_property
    def _sampling_defaults(self) -> SamplingParams:
        return model_sampling(self.config.sampling, self.info.gguf_sampling)

    def sampling_defaults(self) -> SamplingParams:
        """The operator's sampling over the GGUF's own (``llamactor.base.sampling_defaults``)."""
        return self._sampling_defaults

    def served_name(self) -> str:
        return Path(self.info.model_path).name.removesuffix(".gguf")

    def send(self, msg: CallerMessage) -> concurrent.futures.Future[Any]:
        """Deliver ``msg`` to the tree; its answer goes to ``msg.reply`` (whose future this returns)."""
        future = msg.reply.future
        with self._lock:
            if self._closing:
                raise BatcherUnavailableError("llamactor is closing and accepts no new requests")
            self._pending.add(future)
        future.add_done_callback(self._on_done(msg.request_id))
        try:
            self._supervisor.tell(msg)
        except pykka.ActorDeadError:
            msg.reply.fail(BatcherUnavailableError("llamactor is closed"))
        return future

    def cancel(self, request_id: str) -> None:
        """End ``request_id`` now; its caller gets ``CancelledError`` holding the partial completion."""
        try:
            self._supervisor.tell(Cancel(request_id))
        except pykka.ActorDeadError:
            pass

    # -- observing and closing --------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Exact counters: state, running, pending, free_seq_ids, steps, tokens_generated, restarts ...

        Asks the batcher between two steps (this thread waits for the step in progress; the
        supervisor never does). ``published_stats`` answers at once."""
        batcher = self._board.batcher_ref
        own = self._board.supervisor
        if batcher is None or own["state"] != "ready":
            return self.published_stats()
        try:
            return {**cast(dict[str, Any], batcher.ask(GetStats(), timeout=10)), **self._board.supervisor}
        except (pykka.ActorDeadError, pykka.Timeout):
            return self.published_stats()

    def inject_crash(self) -> bool:
        """Fault injection: make the current batcher fail between two steps, as a bug would (the
        supervisor restarts it and its requests resume). False if no batcher was running."""
        batcher = self._board.batcher_ref
        if batcher is None:
            return False
        try:
            batcher.tell(InjectCrash())
        except pykka.ActorDeadError:
            return False
        return True

    def published_stats(self) -> dict[str, Any]:
        """The stats the tree's actors last published (while busy at most ~50 ms or one decode step
        old; exact when idle); never waits, so health checks and metrics scrapes use it."""
        if not self._supervisor.is_alive():
            return {"state": "stopped"}
        return self._board.snapshot()

    def close(self, drain_timeout_s: float | None = 0.0) -> None:
        """Stop the actors. With ``drain_timeout_s`` > 0, first let in-flight requests finish
        (new ones are refused meanwhile); whatever is still waiting then gets
        ``BatcherUnavailableError``."""
        with self._lock:
            self._closing = True
            pending = list(self._pending)
        if drain_timeout_s and pending:
            concurrent.futures.wait(pending, timeout=drain_timeout_s)
        if self._supervisor.is_alive():
            self._supervisor.stop(block=True)
        _running.discard(self._supervisor)

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _on_done(self, request_id: str) -> Any:
        def done(future: concurrent.futures.Future[Completion]) -> None:
            """Runs on the thread that settles ``future``: the batcher's, or a caller's that cancels it."""
            with self._lock:
                self._pending.discard(future)
            if future.cancelled():  # the caller cancelled its future: free the sequence too
                self.cancel(request_id)
        return done
