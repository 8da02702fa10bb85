"""``llamactor.start()`` and the ``LLM`` handle it returns: one model, one actor tree.

Every method runs on the caller's thread (or event loop) and only ``tell``s messages to the
supervisor; nothing here touches llama.cpp. Safe from any number of threads
and event loops at once.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast, overload

import pykka

from llamactor.client import Client
from llamactor.completion import Completion
from llamactor.config import Config
from llamactor.errors import BatcherUnavailableError, InvalidRequestError, ModelLoadError
from llamactor.logging import configure_default
from llamactor.messages import Cancel, Embed, Generate, GetStats, ReplyChannel
from llamactor.models import resolve_model_path
from llamactor.supervisor import SupervisorActor

if TYPE_CHECKING:
    from llamactor.router import Router


@overload
def start(model: str | None = None, *, models: None = None, config: Config | None = None,
          start_timeout_s: float = 300.0, **options: Any) -> LLM: ...
@overload
def start(model: None = None, *, models: Sequence[Any], max_loaded: int | None = None,
          start_timeout_s: float = 300.0, **options: Any) -> Router: ...


def start(model: str | None = None, *, models: Sequence[Any] | None = None, max_loaded: int | None = None,
          config: Config | None = None, start_timeout_s: float = 300.0, **options: Any) -> LLM | Router:
    """Load ``model`` (None: ``$LLAMACTOR_MODEL`` or the default Gemma 3 270M) and start the actors.

    ``options`` are ``Config`` fields (``n_parallel``, ``n_ctx``, ``system_prompt``, ...) and
    default sampling fields (``temperature``, ``max_tokens``, ...). Blocks until the model is
    loaded; raises ``ModelLoadError`` if it cannot be.

    With ``models`` (``ModelSpec``s or dicts: ``name``, ``path``, ``replicas``, ``policy``,
    ``preload``, ``idle_unload_s`` and Config fields), returns a ``Router`` over them; ``options``
    are then defaults for every model, and at most ``max_loaded`` models are loaded at once.
    """
    configure_default()
    if models is not None:
        from llamactor.router import Router  # router builds on this module
        if model is not None or config is not None:
            raise InvalidRequestError("pass either models= or model/config, not both")
        return Router(models, max_loaded=max_loaded, defaults=options)
    if max_loaded is not None:
        raise InvalidRequestError("max_loaded applies to models=[...]")
    if config is None:
        config = Config.from_kwargs(model=model, **options)
    elif model is not None or options:
        raise InvalidRequestError("pass either config= or model/options, not both")
    return start_tree(config, start_timeout_s)


def start_tree(config: Config, start_timeout_s: float = 300.0) -> LLM:
    """Start one supervisor (and its batcher) for ``config``; block until its model is loaded."""
    supervisor = SupervisorActor.start(config, resolve_model_path(config.model))
    proxy = supervisor.proxy()
    if not proxy.ready.get().wait(start_timeout_s):
        supervisor.stop()
        raise ModelLoadError(f"the model did not load within {start_timeout_s:g}s")
    if proxy.state.get() != "ready":
        reason = proxy.failure_reason.get()
        supervisor.stop()
        raise ModelLoadError(reason or "the batcher could not start")
    return LLM(supervisor, config, proxy.info.get())


class LLM(Client):
    """A handle on one running actor tree (the request API: ``Client``). Use as a context
    manager, or call ``close()``."""

    def __init__(self, supervisor: pykka.ActorRef[Any], config: Config, info: Any) -> None:
        self._supervisor = supervisor
        self.config = config
        self.info = info  # llamactor.native.engine.EngineInfo: n_ctx, n_ctx_seq, chat template ...
        self._lock = threading.Lock()
        self._pending: set[concurrent.futures.Future[Completion]] = set()
        self._closing = False

    def cancel(self, request_id: str) -> None:
        """End ``request_id`` now; its caller gets ``CancelledError`` holding the partial completion."""
        try:
            self._supervisor.tell(Cancel(request_id))
        except pykka.ActorDeadError:
            pass

    # -- observing and closing --------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters: state, running, pending, free_seq_ids, steps, tokens_generated, restarts ..."""
        try:
            return cast(dict[str, Any], self._supervisor.ask(GetStats(), timeout=30))
        except pykka.ActorDeadError:
            return {"state": "stopped"}

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

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (caller's thread) --------------------------------------------------------

    def _send(self, msg: Generate | Embed, reply: ReplyChannel) -> concurrent.futures.Future[Any]:
        rid = msg.request_id
        future = reply.future
        with self._lock:
            if self._closing:
                raise BatcherUnavailableError("llamactor is closing and accepts no new requests")
            self._pending.add(future)
        future.add_done_callback(self._on_done(rid))
        try:
            self._supervisor.tell(msg)
        except pykka.ActorDeadError:
            reply.fail(BatcherUnavailableError("llamactor is closed"))
        return future

    def _on_done(self, request_id: str) -> Any:
        def done(future: concurrent.futures.Future[Completion]) -> None:
            with self._lock:
                self._pending.discard(future)
            if future.cancelled():  # the caller cancelled its future: free the sequence too
                self.cancel(request_id)
        return done

