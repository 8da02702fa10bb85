"""The engine's outbox for one front-end link (``engine_link``): the replies of the requests that
front end sent, written to it in frames without ever making a batcher wait for it.

Threads: the batchers (a message's replies handed over once, ``base.step_posts``), the link's
reader and call workers (a refusal, a cancel's end), and the outbox's own sender thread (what the
socket did not take at once).
"""

from __future__ import annotations

import threading
from typing import Any

from llamactor.base.logging import get_logger
from llamactor.base.step_posts import gathered
from llamactor.http.link_frames import EVENTS, FrameWriter, sendable

log = get_logger("llamactor.http.link")


class Outbox:
    """Replies bound for one front end. A batcher hands over what it posted while handling one
    message -- a step's pieces, every stream's -- at once (``base.step_posts``); other threads post
    each reply at once. A hand-over with nothing ahead of it is written there and then, without
    blocking (``FrameWriter.try_write``: no wake of another thread, no GIL ping-pong, per step);
    what the socket does not take at once, and whatever is posted while that is pending, goes to
    the sender thread, which writes it in order -- so a batcher never waits for a front end."""

    def __init__(self, writer: FrameWriter, name: str) -> None:
        self._writer, self._name = writer, name
        self._items: list[tuple[int, int, Any]] = []  # the sender's to write, in order
        self._rest: bytes | None = None  # a frame's unwritten rest (the writer's lock still taken)
        self._busy = False  # a poster or the sender is writing: posts go to ``_items`` behind it
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._send_forever, name=f"{name}-sender", daemon=True)
        self._thread.start()

    def post(self, event: tuple[int, int, Any]) -> None:
        """Any thread: a batcher's, handling a message, only appends to its gathered list."""
        if (items := gathered(self)) is not None:
            items.append(event)
        else:
            self.post_many([event])

    def post_many(self, events: list[tuple[int, int, Any]]) -> None:
        """Any thread, never blocking: ``events`` in order, written now if nothing is ahead of them."""
        with self._lock:
            if self._busy:
                self._items += events
                return
            self._busy = True
        try:
            written = self._writer.try_write((EVENTS, events))
        except OSError:
            written = True  # the front end is gone: the reader cancels its requests
        except Exception as e:  # noqa: BLE001 - a reply that does not pickle fails its own request
            events = self._sendable(events, e)
            written = False  # the sender writes them, in order
        with self._lock:
            if written is True and not self._items:
                self._busy = False
                return
            if written is False:
                self._items[:0] = events  # before whatever was posted meanwhile
            elif written is not True:
                self._rest = written
        self._wake.set()

    def _sendable(self, events: list[tuple[int, int, Any]], error: Exception) -> list[tuple[int, int, Any]]:
        """``events`` with each reply that does not pickle replaced by its request's failure: one bad
        reply ends its own request, never a step's frame (whose other streams go on) nor the thread
        that posted it."""
        log.error("frontend_events_unsendable", frontend=self._name, error=repr(error))
        return sendable(events)

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _send_forever(self) -> None:
        """The sender thread: woken with the writing handed to it, it writes until nothing is left."""
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                if self._rest is not None:  # a frame half written: the writer's lock back for the others
                    self._rest = None
                    self._writer.finish(None)
                return
            try:
                self._drain()
            except OSError:
                return  # the front end is gone: the reader cancels its requests

    def _drain(self) -> None:
        if (rest := self._rest) is not None:
            self._rest = None
            self._writer.finish(rest)
        while True:
            with self._lock:
                items, self._items = self._items, []
                if not items:
                    self._busy = False
                    return
            try:
                self._writer.write((EVENTS, items))
            except OSError:
                raise
            except Exception as e:  # noqa: BLE001 - a reply that does not pickle fails its own request
                self._writer.write((EVENTS, self._sendable(items, e)))
