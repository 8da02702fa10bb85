"""Iterators over one request's text pieces, for threads (``TextStream``) and asyncio
(``AsyncTextStream``); ``merged``, the pieces of a request's ``n`` choices as they arrive.

The batcher thread pushes each piece with a non-blocking call (``SimpleQueue.put`` or
``loop.call_soon_threadsafe``) so a slow reader never stalls the decode loop. Leaving the loop
early (``break``, an exception, a cancelled task) cancels the request and frees its sequence.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
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
        """Called by the batcher thread for each piece."""
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


class AsyncTextStream:
    """``async for piece in stream``, bound to the event loop it was created on."""

    def __init__(self, request_id: str, cancel: Callable[[str], None], loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._cancel = cancel
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self.future: concurrent.futures.Future[Completion] | None = None
        self._queued: concurrent.futures.Future[None] | None = None

    def push(self, piece: Piece) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, piece)

    def attach(self, future: concurrent.futures.Future[Completion], queued: concurrent.futures.Future[None]) -> None:
        self.future, self._queued = future, queued
        future.add_done_callback(lambda _f: self._loop.call_soon_threadsafe(self._queue.put_nowait, _END))

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
                yield piece.text
        finally:
            await pieces.aclose()  # now, not when collected: leaving early cancels the request

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        """The pieces with the logprobs of their tokens (what the HTTP stream sends)."""
        finished = False
        try:
            while (item := await self._queue.get()) is not _END:
                yield item  # type: ignore[misc]
            finished = True
        finally:
            if not finished:
                self._cancel(self.request_id)
        assert self.future is not None
        await asyncio.wrap_future(self.future)

    @property
    def completion(self) -> Completion:
        assert self.future is not None
        return self.future.result()


async def merged(streams: Sequence[AsyncTextStream]) -> AsyncGenerator[ChoiceUpdate, None]:
    """``(index, piece)`` as the choices' pieces arrive, and ``(index, completion)`` once each
    choice ends; the first choice that fails raises its error here (event loop). Closing this
    early (the client left) cancels every choice that is still running."""
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
        ended = 0
        while ended < len(streams):
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            ended += isinstance(item, Completion)
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
