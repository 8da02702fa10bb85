"""Iterators over one request's text pieces, for threads (``TextStream``) and asyncio
(``AsyncTextStream``); ``merged``, the pieces of a request's ``n`` choices as they arrive.

The batcher thread hands each piece over without blocking (``SimpleQueue.put``, or a loop's
``Mailbox``), so a slow reader never stalls the decode loop: what it has not read waits in its
stream (at most its request's new tokens). An event loop's streams share one ``Mailbox``: the
pieces a decode step makes for them all cross to the loop in one ``call_soon_threadsafe``, and
each stream's reader wakes once for everything that arrived for it, and ``buffered`` counts what
``merged`` has not handed on of it, so a writer joins the frames of every step one wake brings
(docs/performance.md, *Host cap (front end)*). Leaving the loop early (``break``, an exception, a cancelled task) cancels the
request and frees its sequence.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import queue
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from llamactor.base.completion import ChoiceUpdate, Completion, Piece

_END = object()


class TextStream:
    """``for piece in stream``; afterwards ``stream.completion`` holds the whole result."""

    def __init__(self, request_id: str, cancel: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._cancel = cancel
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.future: concurrent.futures.Future[Completion] | None = None

    def push(self, piece: Piece) -> None:
        """Called by the batcher thread for each piece (a text stream skips a last one that only
        carries logprobs)."""
        if piece.text:
            self._queue.put(piece.text)

    def attach(self, future: concurrent.futures.Future[Completion]) -> None:
        self.future = future
        future.add_done_callback(lambda _f: self._queue.put(_END))

    def __iter__(self) -> Iterator[str]:
        finished = False
        try:
            while (item := self._queue.get()) is not _END:
                yield item  # type: ignore[misc]
            finished = True
        finally:
            if not finished:
                self.cancel()
        assert self.future is not None
        self.future.result()  # raises the request's error, if it ended in one

    def cancel(self) -> None:
        self._cancel(self.request_id)

    @property
    def completion(self) -> Completion:
        assert self.future is not None
        return self.future.result()


class Mailbox:
    """What the batcher thread hands to one event loop's streams, delivered in batches: the first
    item posted after a delivery schedules the next one (one ``call_soon_threadsafe``, one wake-up
    of the loop's selector), and whatever else is posted before it runs -- the rest of the step's
    pieces, every stream's -- goes with it, in the order posted."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[AsyncTextStream, object]] = []
        self._scheduled = False
        self._in_place = False  # ``in_place``: the loop's thread is handing items on itself

    @contextlib.contextmanager
    def in_place(self) -> Iterator[None]:
        """Event loop: what the loop's own thread posts within this arrives at once, with nothing
        waiting to cross -- no lock, no hop to a later callback (a front-end process reads the
        engine's link on its loop: a frame's pieces reach their streams as it is read). A stream's
        reader still wakes once for all that arrived for it (its wake is a callback of the loop)."""
        self._in_place = True
        try:
            yield
        finally:
            self._in_place = False

    def post(self, stream: AsyncTextStream, item: object) -> None:
        """Any thread; RuntimeError when the loop is closed (the batcher then cancels the request)."""
        if self._loop.is_closed():
            raise RuntimeError("the stream's event loop is closed")
        # in place: whatever another thread posted before is in ``_items`` when this looks (the
        # GIL orders the two), so a stream's items keep their order
        if self._in_place and not self._items and asyncio._get_running_loop() is self._loop:
            stream.arrived(item)
            return
        with self._lock:
            self._items.append((stream, item))
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        """Event loop: every item posted since the last delivery, to its stream."""
        with self._lock:
            items, self._items, self._scheduled = self._items, [], False
        for stream, item in items:
            stream.arrived(item)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = weakref.WeakKeyDictionary()
_mailboxes_lock = threading.Lock()  # loops on several threads may make their first streams at once


def mailbox_of(loop: asyncio.AbstractEventLoop) -> Mailbox:
    """``loop``'s mailbox, made with its first stream (the loop's thread)."""
    with _mailboxes_lock:
        if (box := _mailboxes.get(loop)) is None:
            box = _mailboxes[loop] = Mailbox(loop)
        return box


class AsyncTextStream:
    """``async for piece in stream``, bound to the event loop it was created on."""

    def __init__(self, request_id: str, cancel: Callable[[str], None], loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._cancel = cancel
        self._loop = loop
        self._mailbox = mailbox_of(loop)
        self._buffer: collections.deque[object] = collections.deque()
        self._held = 0  # pieces of the batch ``merged`` reads that it has not handed on yet
        self._waiter: asyncio.Future[None] | None = None
        self.future: concurrent.futures.Future[Completion] | None = None
        self._queued: concurrent.futures.Future[None] | None = None

    def push(self, piece: Piece) -> None:
        """Batcher thread: one piece, on its way to the loop with the rest of the step's."""
        self._mailbox.post(self, piece)

    def attach(self, future: concurrent.futures.Future[Completion], queued: concurrent.futures.Future[None]) -> None:
        self.future, self._queued = future, queued
        # through the mailbox too, so that the end comes after every piece posted before it
        future.add_done_callback(lambda _f: self._post_end())

    def _post_end(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to read
            self._mailbox.post(self, _END)

    def arrived(self, item: object) -> None:
        """Event loop (the mailbox's delivery): buffer ``item``, wake the reader if it waits."""
        self._buffer.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    @property
    def buffered(self) -> bool:
        """Whether items wait to be read (event loop): reading them now does not block."""
        return bool(self._buffer) or self._held > 0

    async def queued(self) -> None:
        """Return once the batcher has accepted the request (tokenized, checked, queued); raise the
        ``LlamactorError`` it was refused with otherwise. Nothing is streamed before this."""
        assert self._queued is not None
        await asyncio.wrap_future(self._queued)

    def cancel(self) -> None:
        self._cancel(self.request_id)

    async def __aiter__(self) -> AsyncIterator[str]:  # type: ignore[override]
        pieces = self.pieces()
        try:
            async for piece in pieces:
                if piece.text:  # not a last piece that only carries logprobs
                    yield piece.text
        finally:
            await pieces.aclose()  # now, not when collected: leaving early cancels the request

    async def batches(self) -> AsyncGenerator[list[Piece], None]:
        """The pieces in the batches they arrived in (each stream's share of one or more steps);
        afterwards the request's error, if it ended in one (event loop)."""
        buffer, finished = self._buffer, False
        try:
            while not finished:
                while not buffer:  # waited for here, not in a coroutine of its own: one per token
                    self._waiter = self._loop.create_future()
                    try:
                        await self._waiter
                    finally:
                        self._waiter = None
                items = list(buffer)
                buffer.clear()
                if finished := items[-1] is _END:
                    items.pop()
                if items:
                    yield items  # type: ignore[misc]
        finally:
            if not finished:
                self._cancel(self.request_id)
        assert self.future is not None
        await asyncio.wrap_future(self.future)

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        """The pieces with the logprobs of their tokens (what the HTTP stream sends)."""
        async with contextlib.aclosing(self.batches()) as batches:
            async for batch in batches:
                for piece in batch:
                    yield piece

    @property
    def completion(self) -> Completion:
        assert self.future is not None
        return self.future.result()


async def merged(streams: Sequence[AsyncTextStream],
                 ended: Callable[[Completion], None] | None = None) -> AsyncGenerator[ChoiceUpdate, None]:
    """``(index, piece)`` as the choices' pieces arrive, and ``(index, completion)`` once each
    choice ends (``ended`` is called with it first: the metrics' count, here rather than in a
    generator of its own around this one, which each piece would cross); the first choice that
    fails raises its error here (event loop). Closing this early (the client left) cancels every
    choice that is still running."""
    if len(streams) == 1:  # the common case: no task and queue between the stream and its
        # reader, whose batches are read here, not through ``pieces``: one generator less per piece
        stream = streams[0]
        async with contextlib.aclosing(stream.batches()) as batches:
            async for batch in batches:
                stream._held = len(batch)  # noqa: SLF001 - so that ``buffered`` counts what is left of it
                for piece in batch:
                    stream._held -= 1  # noqa: SLF001
                    yield 0, piece
        completion = stream.completion
        if ended is not None:
            ended(completion)
        yield 0, completion
        return
    queue: asyncio.Queue[tuple[int, Piece | Completion | BaseException]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncTextStream) -> None:
        try:
            async for piece in stream.pieces():
                queue.put_nowait((index, piece))
            queue.put_nowait((index, stream.completion))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which decides
            queue.put_nowait((index, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        ended_choices = 0
        while ended_choices < len(streams):
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, Completion):
                ended_choices += 1
                if ended is not None:
                    ended(item)
            yield index, item
    finally:
        for task in tasks:
            task.cancel()


def buffered(streams: Sequence[AsyncTextStream]) -> bool:
    """Whether any of ``streams`` holds pieces not read yet (event loop): a writer that sees
    True may wait for them before it writes, and so write one step's events at once."""
    return any(s.buffered for s in streams)


def buffered_check(streams: Sequence[AsyncTextStream]) -> Callable[[], bool]:
    """``buffered(streams)`` as a call without arguments, asked once per piece (event loop): for
    the one stream of most requests, its own ``buffered`` alone."""
    if len(streams) == 1:
        stream = streams[0]
        return lambda: stream.buffered
    return functools.partial(buffered, streams)
