"""A batcher's replies gathered over one message (``base.step_posts``): handed to each sink once,
in the order posted, at the end -- a failing message's too; other threads post at once."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from llamactor.base.step_posts import gathered, gathering_posts

pytestmark = pytest.mark.pure


class Sink:
    def __init__(self) -> None:
        self.handed: list[list[Any]] = []

    def post(self, item: Any) -> None:
        if (items := gathered(self)) is not None:
            items.append(item)
        else:
            self.handed.append([item])

    def post_many(self, items: list[Any]) -> None:
        self.handed.append(items)


def test_posts_inside_are_handed_over_once_per_sink_in_order_at_the_end() -> None:
    a, b = Sink(), Sink()
    with gathering_posts():
        a.post(1)
        b.post("x")
        with gathering_posts():  # nested: the outer one hands over
            a.post(2)
        a.post(3)
        assert a.handed == [] and b.handed == []
    assert a.handed == [[1, 2, 3]] and b.handed == [["x"]]
    a.post(4)  # outside: at once
    assert a.handed == [[1, 2, 3], [4]] and gathered(a) is None


def test_a_message_that_raises_still_hands_over_what_it_posted() -> None:
    sink = Sink()
    with pytest.raises(RuntimeError), gathering_posts():
        sink.post("piece")
        raise RuntimeError("the step failed")
    assert sink.handed == [["piece"]]


def test_another_threads_gathering_is_its_own() -> None:
    sink = Sink()
    with gathering_posts():
        sink.post("batcher's")
        other = threading.Thread(target=sink.post, args=("reader's",))
        other.start()
        other.join()
        assert sink.handed == [["reader's"]]
    assert sink.handed == [["reader's"], ["batcher's"]]
