"""Replies a batcher posts while it handles one message, gathered and handed over once at its end.

A reply channel whose events go to another thread (the engine's end of a front-end link:
``http.link_outbox.Outbox``) would otherwise take a lock and wake that thread for the first
piece of every step, and the woken thread would then contend for the GIL with the batcher
mid-step, sending frames of one or two pieces. Instead the batcher runs each message inside
``gathering_posts()``; a sink's ``post`` then only appends to this thread's list for it
(``gathered``), and the lists go to each sink's ``post_many`` once the message is handled --
even when it raised, so a failing batcher's last pieces still precede whatever the supervisor
posts next. A thread outside ``gathering_posts`` (a link's reader, a supervisor) posts at once.

Order holds: one thread's posts to one sink keep their order, and a request's events come from
the one batcher that runs it (a resumed request's next batcher starts after the old one ended).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Protocol


class PostSink(Protocol):
    """Where gathered posts go (hashable: the gathering keys its lists by sink)."""

    def post_many(self, items: list[Any]) -> None:
        """Any thread: ``items``, in order, as though each was posted now."""


_local = threading.local()


@contextlib.contextmanager
def gathering_posts() -> Iterator[None]:
    """The batcher thread, around one message: the posts its sinks get meanwhile go out at the end,
    one ``post_many`` per sink, sinks in the order first posted to. Nested: the outer one hands over."""
    if getattr(_local, "gathered", None) is not None:
        yield
        return
    gathered: dict[PostSink, list[Any]] = {}
    _local.gathered = gathered
    try:
        yield
    finally:
        _local.gathered = None
        for sink, items in gathered.items():
            sink.post_many(items)


def gathered(sink: PostSink) -> list[Any] | None:
    """This thread's list of posts for ``sink`` while it gathers (append to it), else None: post now."""
    lists: dict[PostSink, list[Any]] | None = getattr(_local, "gathered", None)
    if lists is None:
        return None
    items = lists.get(sink)
    if items is None:
        items = lists[sink] = []
    return items
