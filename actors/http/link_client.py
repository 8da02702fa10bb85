"""A front-end process's side of its link to the engine's process (docs/performance.md, *Host cap
(front end)*): ``LinkModel``, the ``ModelClient`` the HTTP app calls as it would an in-process
model, and ``LinkRouter``, the models by name.

``EngineConnection`` numbers each message it sends (a token), keeps its reply channel, and hands
the engine's replies to it -- on the event loop in a front-end process (``read_on_loop``: a
frame's pieces reach their streams as it is read), else on a reader thread of its own. What the
app asks without waiting (loaded or not, the model's info, ``GET /models``) the engine pushes as
it changes; what may wait (loading, stats) is a blocking call, made from worker threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import pickle
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from llamactor.base.completion import Completion
from llamactor.base.engine_info import EngineInfo
from llamactor.base.errors import BatcherUnavailableError
from llamactor.base.messages import CallerMessage, Generate, ReplyChannel
from llamactor.base.sampling import SamplingParams
from llamactor.base.sampling_defaults import model_sampling
from llamactor.handles.model import ModelClient
from llamactor.handles.streams import mailbox_of
from llamactor.http.engine_link import ModelView
from llamactor.base.tenants import Tenant
from llamactor.handles.limits import Limiter, RateLimiter
from llamactor.http.link_frames import (CALL, CANCEL, EVENTS, HEADER, LIMITED, LIMITS, OK, PIECE, QUEUED, READY,
                                        RESULT, SEND, SETTLE, STATUS, FrameReader, FrameWriter, event_piece)
from llamactor.http.link_state import LinkLimiter, Sends, collecting
from llamactor.scheduling.rate_limits import Limits
from llamactor.serving.model_specs import ModelSpec, model_named

Future = concurrent.futures.Future
GONE = "the engine's process is gone"
READ_BYTES = 1 << 20  # what the loop reads of the link at once


class EngineConnection:
    """The link, seen from the front end. ``on_ready(views)`` runs once the engine serves its
    models; ``on_lost()`` once the link ends (on the reading loop or thread). Sending: any thread."""

    def __init__(self, sock: socket.socket, on_ready: Callable[[list[ModelView]], None],
                 on_lost: Callable[[], None]) -> None:
        self._writer = FrameWriter(sock)
        self._reader = FrameReader(sock)
        self._replies: dict[int, ReplyChannel] = {}
        self._calls: dict[int, Future[Any]] = {}
        self._limits: dict[int, Limits] = {}  # a LIMITED group's, until the engine says what the tenant has left
        self._tokens = itertools.count()
        self.views: dict[str, ModelView] = {}
        self._on_ready, self._on_lost = on_ready, on_lost
        self.lost = False
        self._sock = sock
        self._unread = bytearray()

    def read_in_thread(self) -> None:
        """Read the engine's frames on a thread of their own (where no event loop runs)."""
        threading.Thread(target=self._read_forever, name="engine-link-reader", daemon=True).start()

    def read_on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the engine's frames on ``loop`` (its thread): no thread takes turns with the loop."""
        self._loop = loop
        self._mailbox = mailbox_of(loop)  # its streams' (made here, on the loop's thread)
        loop.add_reader(self._sock.fileno(), self._readable)

    def send(self, model: str, msgs: Sequence[CallerMessage]) -> list[Future[Any]]:
        """Any thread: ``msgs`` (one request's, together) to ``model``; their futures."""
        items = []
        for msg in msgs:
            token = next(self._tokens)
            self._replies[token] = msg.reply
            msg.reply.future.add_done_callback(self._cancel_if_cancelled(model, msg.request_id))
            items.append((token, msg))
        stream = any(m.reply.on_piece is not None for m in msgs)
        if (group := collecting()) is not None:  # a tenant's limited request: its frame goes later
            group.append((model, items, stream))
            return [m.reply.future for m in msgs]
        try:
            self._writer.write((SEND, model, items, stream))
        except OSError:
            self.drop([(model, items, stream)], BatcherUnavailableError(GONE))
        return [m.reply.future for m in msgs]

    def send_limited(self, sends: Sends, tenant: Tenant, tokens: int) -> tuple[int, Limits]:
        """Any thread: ``sends`` (what ``send`` collected) in one frame, within ``tenant``'s limits
        counted in the engine (``link_state``); the group's number (``settle`` takes it) and what
        the tenant has left, filled in place before the messages' first reply is handed on."""
        group, limits = next(self._tokens), Limits()
        self._limits[group] = limits
        try:
            self._writer.write((LIMITED, group, tenant, tokens, sends))
        except OSError:
            self._limits.pop(group, None)
            self.drop(sends, BatcherUnavailableError(GONE))
        return group, limits

    def settle(self, group: int, used: int) -> None:
        """Any thread: the group's request has ended, having used ``used`` tokens."""
        try:
            self._writer.write((SETTLE, group, used))
        except OSError:
            pass  # the engine is gone, and its buckets with it

    def drop(self, sends: Sends, error: BaseException) -> None:
        """Forget the messages of ``sends`` (never sent), each failed with ``error`` unless done."""
        for _, items, _ in sends:
            for token, msg in items:
                self._replies.pop(token, None)
                msg.reply.fail(error)

    def _cancel_if_cancelled(self, model: str, request_id: str) -> Callable[[Future[Any]], None]:
        """A caller that cancels its future (a client gone, a timeout) cancels the request there."""
        def cancel(future: Future[Any]) -> None:
            if future.cancelled():
                self.cancel(model, request_id)
        return cancel

    def cancel(self, model: str, request_id: str) -> None:
        try:
            self._writer.write((CANCEL, model, request_id))
        except OSError:
            pass  # the engine is gone, and its requests with it

    def call(self, method: str, model: str | None, *args: Any) -> Any:
        """A blocking question to the engine (never on the event loop); raises what it raised."""
        return self._asked(method, model, args).result()

    async def call_async(self, method: str, *args: Any) -> Any:
        """The event loop: a question about no model (the shared state's), awaited."""
        return await asyncio.wrap_future(self._asked(method, None, args))

    def _asked(self, method: str, model: str | None, args: tuple[Any, ...]) -> Future[Any]:
        call_id, future = next(self._tokens), Future[Any]()
        self._calls[call_id] = future
        try:
            self._writer.write((CALL, call_id, method, model, args))
        except OSError:
            self._calls.pop(call_id, None)
            raise BatcherUnavailableError(GONE) from None
        return future

    def _read_forever(self) -> None:
        """The reader thread: the engine's frames in order; at the end, everything waiting fails."""
        while (frame := self._reader.read()) is not None:
            self._handle(frame)
        self._end()

    def _readable(self) -> None:
        """The event loop: the socket's whole frames in order, their pieces handed on in place."""
        try:
            data = self._sock.recv(READ_BYTES, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._loop.remove_reader(self._sock.fileno())
            self._end()
            return
        unread = self._unread
        unread += data
        start, size = 0, len(unread)
        try:  # (the frames read dropped once, after: per frame, that moved the rest of a read of many)
            with self._mailbox.in_place():
                while size - start >= HEADER.size:
                    end = start + HEADER.size + HEADER.unpack_from(unread, start)[0]
                    if size < end:
                        break
                    frame = pickle.loads(memoryview(unread)[start + HEADER.size:end])
                    start = end
                    self._handle(frame)
        finally:
            del unread[:start]

    def _handle(self, frame: tuple[Any, ...]) -> None:
        kind = frame[0]
        if kind == EVENTS:
            self._deliver(frame[1])
        elif kind == RESULT:
            if (future := self._calls.pop(frame[1], None)) is not None:
                (future.set_result if frame[2] else future.set_exception)(frame[3])
        elif kind == STATUS:
            self.views[frame[1]] = frame[2]
        elif kind == READY:
            self.views.update((v.name, v) for v in frame[1])
            self._on_ready(frame[1])

    def _deliver(self, events: list[tuple[int, int, Any]]) -> None:
        """One frame's replies, each to its own channel (tokens are this link's alone)."""
        replies = self._replies
        for token, kind, value in events:
            if (reply := replies.get(token)) is None:
                if kind == LIMITS and (limits := self._limits.pop(token, None)) is not None and value is not None:
                    limits.values.update(value.values)  # a group's: read when its response starts
                continue
            if kind >= PIECE:  # the most of a frame, asked first: a piece, handed on as the engine sent it
                reply.hand_on(event_piece(kind, value))
            elif kind == QUEUED:
                reply.mark_queued()
            else:  # OK or ERROR: the request's end
                del replies[token]
                (reply.resolve if kind == OK else reply.fail)(value)

    def _end(self) -> None:
        self.lost = True
        replies, self._replies = self._replies, {}
        for reply in replies.values():
            reply.fail(BatcherUnavailableError(GONE))
        self._limits.clear()
        calls, self._calls = self._calls, {}
        for future in calls.values():
            future.set_exception(BatcherUnavailableError(GONE))
        self._on_lost()


class LinkModel(ModelClient):
    """One model of the engine's process, as the HTTP app uses it (caller threads; ``loaded``,
    ``info`` and ``sampling_defaults`` never wait once the model is loaded)."""

    def __init__(self, spec: ModelSpec, connection: EngineConnection) -> None:
        self.spec, self.name, self.config = spec, spec.name, spec.config
        self._link = connection
        self._defaults: tuple[EngineInfo, SamplingParams] | None = None

    @property
    def _view(self) -> ModelView:
        return self._link.views[self.name]

    @property
    def loaded(self) -> bool:
        return self._view.loaded

    @property
    def info(self) -> EngineInfo:
        if (info := self._view.info) is None:
            self.load()
            info = self._link.views[self.name].info
            assert info is not None
        return info

    def sampling_defaults(self) -> SamplingParams:
        """The operator's sampling over the GGUF's, computed once per loaded info."""
        info = self.info
        if self._defaults is None or self._defaults[0] is not info:
            self._defaults = (info, model_sampling(self.config.sampling, info.gguf_sampling))
        return self._defaults[1]

    def load(self) -> None:
        """A worker thread: loads the model in the engine (``ModelLoadError`` as it raised it)."""
        self._link.call("load", self.name)
        self._link.views[self.name] = self._link.call("view", self.name)

    def send(self, msg: CallerMessage) -> Future[Any]:
        return self._link.send(self.name, [msg])[0]

    def send_n(self, msgs: Sequence[Generate]) -> list[Future[Completion]]:
        return self._link.send(self.name, msgs)

    def cancel(self, request_id: str) -> None:
        self._link.cancel(self.name, request_id)

    @functools.cached_property
    def limiter(self) -> RateLimiter | None:
        """The model's ``Config.tenants``' limits, counted in the engine (once, whichever front end)."""
        return LinkLimiter(self._link) if Limiter.for_tenants(self.config.tenants) is not None else None

    def replica_stats(self, *, exact: bool = False) -> list[dict[str, Any]]:
        """A worker thread: the engine's published stats of the model's replicas."""
        return self._link.call("replica_stats", self.name, exact)  # type: ignore[no-any-return]


class LinkRouter:
    """The engine's models by name (``ServerState.router`` in a front-end process), with the
    router's ``load``, ``unload`` and ``describe`` (blocking: worker threads, except ``describe``)."""

    def __init__(self, specs: list[ModelSpec], connection: EngineConnection) -> None:
        self._link = connection
        self._models = {s.name: LinkModel(s, connection) for s in specs}
        self.names = list(self._models)

    def model(self, name: str | None = None) -> LinkModel:
        return model_named(self._models, name)

    def load(self, name: str) -> None:
        self.model(name).load()

    def unload(self, name: str, drain_timeout_s: float | None = 0.0) -> None:
        self._link.call("unload", name, drain_timeout_s)
        self._link.views[name] = self._link.call("view", name)

    def describe(self, name: str) -> dict[str, Any] | None:
        return self._link.views[self.model(name).name].described
