"""The engine's ``Outbox`` for a front-end link under a batcher's gathering (``base.step_posts``):
a step's pieces leave in one frame, in order, at its end; other threads' posts leave at once."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from llamactor.base.step_posts import gathering_posts
from llamactor.http.engine_link import Outbox
from llamactor.http.link_frames import EVENTS, OK, QUEUED, TEXT, FrameReader, FrameWriter

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
