"""The engine's ``Outbox`` (``http/link_outbox.py``) for a front-end link under a batcher's gathering (``base.step_posts``):
a step's pieces leave in one frame, in order, at its end; other threads' posts leave at once; a
front end that reads slowly never blocks a poster (the rest goes to the sender thread, in order)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from llamactor.base.step_posts import gathering_posts
from llamactor.base.errors import EngineError
from llamactor.http.link_frames import ERROR, EVENTS, OK, QUEUED, TEXT, FrameReader, FrameWriter
from llamactor.http.link_outbox import Outbox

pytestmark = pytest.mark.pure


@pytest.fixture
def outbox() -> Any:
    ours, theirs = socket.socketpair()
    box = Outbox(FrameWriter(ours), "test")
    yield box, FrameReader(theirs)
    box.close()
    ours.close()
    theirs.close()


def test_a_steps_pieces_leave_in_one_frame_after_what_other_threads_posted_meanwhile(outbox: Any) -> None:
    box, reader = outbox
    with gathering_posts():
        box.post((1, TEXT, "a"))
        box.post((2, TEXT, "b"))
        other = threading.Thread(target=box.post, args=((3, QUEUED, None),))  # e.g. the link's reader
        other.start()
        other.join()
        assert reader.read() == (EVENTS, [(3, QUEUED, None)])  # sent while the step still gathers
        box.post((1, TEXT, "c"))
        box.post((1, OK, "done"))
    assert reader.read() == (EVENTS, [(1, TEXT, "a"), (2, TEXT, "b"), (1, TEXT, "c"), (1, OK, "done")])


def test_a_front_end_that_reads_slowly_never_blocks_a_poster_and_loses_no_order(outbox: Any) -> None:
    """What the socket does not take at once goes to the sender thread; later posts queue behind it."""
    box, reader = outbox
    big = "x" * (4 << 20)  # far beyond a socket buffer: this post is written in part
    box.post_many([(1, TEXT, big)])  # returns without waiting for the front end to read
    with gathering_posts():
        box.post((2, TEXT, "after"))
    box.post((1, OK, "done"))
    got = []
    while sum(len(frame[1]) for frame in got) < 3:
        got.append(reader.read())
    assert [event for frame in got for event in frame[1]] == [(1, TEXT, big), (2, TEXT, "after"), (1, OK, "done")]


def test_try_write_keeps_the_lock_for_a_frames_rest_until_it_is_finished() -> None:
    ours, theirs = socket.socketpair()
    writer, reader = FrameWriter(ours), FrameReader(theirs)
    rest = writer.try_write((EVENTS, [(1, TEXT, "y" * (4 << 20))]))
    assert isinstance(rest, bytes) and rest
    assert writer.try_write((EVENTS, [])) is False  # a frame is half written: nothing else may start
    finishing = threading.Thread(target=writer.finish, args=(rest,))
    finishing.start()
    assert reader.read() == (EVENTS, [(1, TEXT, "y" * (4 << 20))])
    finishing.join()
    assert writer.try_write((EVENTS, [(2, OK, None)])) is True and reader.read() == (EVENTS, [(2, OK, None)])
    ours.close()
    theirs.close()


def test_a_reply_that_cannot_be_pickled_fails_its_own_request_and_the_others_go_on(outbox: Any) -> None:
    box, reader = outbox
    with gathering_posts():  # as a batcher's step: nothing may raise into it
        box.post((1, OK, lambda: None))
        box.post((3, TEXT, "piece"))
    box.post((2, OK, "next"))
    events: list[Any] = []
    while len(events) < 3:
        kind, frame = reader.read()
        assert kind == EVENTS
        events += frame
    (token, kind, error), *rest = events
    assert (token, kind) == (1, ERROR) and isinstance(error, EngineError)
    assert "could not be sent to the front end" in str(error)
    assert rest == [(3, TEXT, "piece"), (2, OK, "next")]
