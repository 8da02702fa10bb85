"""The engine's end of one front-end process's link (docs/performance.md, *Host cap (front end)*).

The engine's process keeps the models (``Router``: trees, supervisors, the scheduler's tenants'
fair shares and cache scopes, which travel in each message); a front-end process runs the HTTP
app and sends it the messages its handlers make. Here each message gets a reply channel of this
process whose pieces, acceptance and end are posted to the link's ``Outbox``, which sends what a
step posted as one frame. A front end that goes away (closed, killed) takes its requests with it:
every one still running is cancelled, so its sequences are freed. What every front end shares --
the tenants' rate limits, the stored responses -- is the link's ``EngineState`` (the daemon's one).

Threads: the link's reader (front end's frames; a ``LIMITED`` frame's reservation is taken or
refused there, never waited for), its sender (what the outbox could not write at once), a few
workers for the front end's blocking questions (loading a model, stats, the shared state's calls);
replies are posted from the batchers' (gathered per message, written by them when nothing is ahead).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llamactor.base.engine_info import EngineInfo
from llamactor.base.logging import get_logger
from llamactor.base.messages import CallerMessage, Generate, ReplyChannel
from llamactor.base.tenants import Tenant
from llamactor.handles.limits import Reservation
from llamactor.http.engine_state import CALLS, EngineState
from llamactor.http.link_frames import (CALL, CANCEL, ERROR, LIMITED, LIMITS, OK, QUEUED, READY, RESULT, SEND,
                                        SETTLE, STATUS, FrameReader, FrameWriter, piece_event, portable_error)
from llamactor.http.link_outbox import Outbox

log = get_logger("llamactor.http.link")
CALL_WORKERS = 4  # a front end's blocking questions at once (a model loading must not hold up stats)


@dataclass(frozen=True, slots=True)
class ModelView:
    """What a front end keeps of one model without asking: loaded or not, its info once loaded,
    what ``GET /models`` says of it (the router's ``describe``)."""

    name: str
    loaded: bool
    info: EngineInfo | None
    described: dict[str, Any] | None


def model_view(router: Any, name: str) -> ModelView:
    """``name``'s view in ``router`` now (any thread)."""
    replicas = router.model(name)
    loaded = replicas.loaded
    describe = getattr(router, "describe", None)
    return ModelView(name, loaded, replicas.info if loaded else None,
                     describe(name) if describe is not None else None)


class EngineLink:
    """One front end's link, served over ``router`` (a ``Router``, or anything with ``model(name)``).
    ``calls``: more CALL methods the engine's process answers by name, beside the router's
    (``jobs``: the batch jobs, ``link_jobs``); their functions get the CALL's arguments."""

    def __init__(self, sock: socket.socket, name: str = "frontend", state: EngineState | None = None,
                 *, calls: dict[str, Callable[..., Any]] | None = None) -> None:
        """``state``: what every front end shares (the daemon's; a link alone gets its own)."""
        self.name = name
        self.state = state or EngineState()
        self._more_calls = dict(calls or {})
        self._sock = sock
        self._writer = FrameWriter(sock)
        self._reader = FrameReader(sock)
        self._outbox = Outbox(self._writer, name)
        self._router: Any = None
        self._inflight: dict[int, tuple[Any, str]] = {}  # token -> (model client, request id)
        self._reservations: dict[int, Reservation] = {}  # a LIMITED group's, until its SETTLE (the reader's)
        self._lock = threading.Lock()
        self._calls = concurrent.futures.ThreadPoolExecutor(CALL_WORKERS, thread_name_prefix=f"{name}-call")
        self.closed = threading.Event()
        threading.Thread(target=self._read_forever, name=f"{name}-reader", daemon=True).start()

    def serve(self, router: Any) -> None:
        """The models are there (the daemon's loader thread): tell the front end, then each change."""
        self._router = router
        if hasattr(router, "status_listeners"):
            router.status_listeners.append(self._status_changed)
        self._write((READY, [model_view(router, n) for n in router.names]))

    def _status_changed(self, name: str) -> None:
        self._write((STATUS, name, model_view(self._router, name)))

    def _write(self, frame: Any) -> None:
        try:
            self._writer.write(frame)
        except OSError:
            pass  # gone: the reader sees the end and cleans up

    def _read_forever(self) -> None:
        """The reader thread: each frame handled in turn; at the end, the front end's requests cancelled."""
        while (frame := self._reader.read()) is not None:
            try:
                self._handle(frame)
            except Exception as e:  # noqa: BLE001 - one bad frame must not end the link
                log.error("frontend_frame_failed", frontend=self.name, error=repr(e))
        self._lost()

    def _handle(self, frame: tuple[Any, ...]) -> None:
        kind = frame[0]
        if kind == SEND:
            self._send(frame[1], frame[2], frame[3])
        elif kind == CANCEL:
            self._router.model(frame[1]).cancel(frame[2])
        elif kind == CALL:
            self._calls.submit(self._answer, *frame[1:])
        elif kind == LIMITED:
            self._send_limited(*frame[1:])
        elif kind == SETTLE:
            if (reservation := self._reservations.pop(frame[1], None)) is not None:
                self.state.limiter.settle(reservation, frame[2])

    def _send(self, model: str, items: list[tuple[int, CallerMessage]], stream: bool) -> None:
        """The messages of one request (its ``n`` choices together), each with a channel here."""
        msgs = [dataclasses.replace(msg, reply=self._channel(token, msg.request_id, stream)) for token, msg in items]
        try:
            llm = self._router.model(model)
            with self._lock:
                for token, msg in items:
                    self._inflight[token] = (llm, msg.request_id)
            if len(msgs) > 1 and all(isinstance(m, Generate) for m in msgs):
                llm.send_n(msgs)
            else:
                for msg in msgs:
                    llm.send(msg)
        except Exception as e:  # noqa: BLE001 - refused before queueing (unloaded, draining): each message fails
            for msg in msgs:
                msg.reply.fail(e)

    def _send_limited(self, group: int, tenant: Tenant, tokens: int,
                      sends: list[tuple[str, list[tuple[int, CallerMessage]], bool]]) -> None:
        """The reader thread: a tenant's messages within its limits (``Limiter.submit``'s order):
        reserved now, what the tenant has left posted
        first, then sent; settled by the group's SETTLE, which the front end sends once what its
        ``send`` answered has ended (a rerank's later requests too). Refused (429, or 400 for what
        could never fit), each message fails with why before anything is queued."""
        try:
            reservation = self.state.limiter.reserve(tenant, tokens)
        except Exception as e:  # noqa: BLE001 - each message answers with it
            error = portable_error(e)
            self._outbox.post((group, LIMITS, None))
            for _, items, _ in sends:
                for token, _ in items:
                    self._outbox.post((token, ERROR, error))
            return
        self._outbox.post((group, LIMITS, reservation.limits))
        if reservation.limits.values:
            self._reservations[group] = reservation
        for model, items, stream in sends:
            self._send(model, items, stream)

    def _channel(self, token: int, request_id: str, stream: bool) -> ReplyChannel:
        """A reply channel whose every event goes to the outbox under ``token``."""
        post = self._outbox.post
        reply = ReplyChannel(on_piece=(lambda piece: post(piece_event(token, piece))) if stream else None)

        def queued(f: concurrent.futures.Future[None]) -> None:
            if not f.cancelled() and f.exception() is None:
                post((token, QUEUED, None))

        def done(f: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                self._inflight.pop(token, None)
            error = f.exception() if not f.cancelled() else concurrent.futures.CancelledError()
            post((token, OK, f.result()) if error is None else (token, ERROR, portable_error(error)))

        reply.queued.add_done_callback(queued)
        reply.future.add_done_callback(done)
        return reply

    def _answer(self, call_id: int, method: str, model: str | None, args: tuple[Any, ...]) -> None:
        """A worker: one blocking question, answered with its result or its error."""
        try:
            value, ok = self._ask(method, model, args), True
        except Exception as e:  # noqa: BLE001 - the asker re-raises it
            value, ok = portable_error(e), False
        self._write((RESULT, call_id, ok, value))

    def _ask(self, method: str, model: str | None, args: tuple[Any, ...]) -> Any:
        if (answer := self._more_calls.get(method)) is not None:
            return answer(*args)
        router = self._router
        if method == "replica_stats":
            return router.model(model).replica_stats(exact=bool(args and args[0]))
        if method in ("load", "unload"):
            return getattr(router, method)(model, *args)
        if method == "view":
            return model_view(router, model or router.names[0])
        if method in CALLS:  # the front ends' shared state: rate limits, stored responses
            return self.state.call(method, args)
        raise ValueError(f"unknown call {method!r}")

    def _lost(self) -> None:
        """The front end is gone: cancel what it left running, stop sending."""
        with self._lock:
            left, self._inflight = list(self._inflight.values()), {}
        self._reservations.clear()  # their estimates stay spent: the requests are cancelled unsettled
        for llm, request_id in left:
            llm.cancel(request_id)
        if left:
            log.warning("frontend_requests_cancelled", frontend=self.name, requests=len(left))
        if self._router is not None and hasattr(self._router, "status_listeners"):
            self._router.status_listeners.remove(self._status_changed)
        self._outbox.close()
        self._calls.shutdown(wait=False)
        self._sock.close()
        self.closed.set()
