"""The supervisor with stub batchers: restarts, replays, giving up and cancels, in seconds, no model.

As in pykka's own tests, the actors a test needs are kept small (tests/support/stub_tree.py): a
stub batcher says it is ready, records what it is told, holds each request until the test has it
answered, and crashes on demand, reporting ``BatcherFailed`` from ``on_failure`` as the real
batcher does. Every wait is on an event, a future or a round trip through an actor's inbox; none
is a sleep.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pykka
import pytest

from llamactor.base.config import Config
from llamactor.base.errors import BatcherUnavailableError, CancelledError
from llamactor.base.messages import Cancel, Generate
from llamactor.tree.supervisor import SupervisorActor

from tests.support.stub_tree import TIMEOUT, Answer, Batchers, HoldingBoard, Tree, completion, generated

pytestmark = pytest.mark.pure


@pytest.fixture
def start_tree() -> Iterator[Callable[..., Tree]]:
    """Start a supervisor on stub batchers; afterwards every actor the test started is stopped."""
    before = set(pykka.ActorRegistry.get_all())
    trees: list[Tree] = []

    def start(**config: Any) -> Tree:
        batchers, board = Batchers(), HoldingBoard()
        supervisor = SupervisorActor.start(Config(**config), "stub.gguf", start_batcher=batchers, board=board)
        trees.append(Tree(supervisor, batchers, board))
        return trees[-1]

    yield start
    for tree in trees:  # a failed test may have left a thread held
        tree.board.release.set()
        for release in tree.releases:
            release.set()
        tree.supervisor.stop(block=True)  # stops its batcher too
    for ref in set(pykka.ActorRegistry.get_all()) - before:
        ref.stop()


# -- the tests --------------------------------------------------------------------------------

def test_a_crashed_batcher_is_restarted_and_the_next_receives_every_request_in_flight_in_submission_order(
        start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    sent = [tree.submit(f"r{i}") for i in range(4)]
    assert generated(tree.told(1)) == ["r0", "r1", "r2", "r3"]
    tree.crash(1)
    replayed = [m for m in tree.told(2) if isinstance(m, Generate)]
    assert [m.request_id for m in replayed] == ["r0", "r1", "r2", "r3"]
    assert all(r is s for r, s in zip(replayed, sent))  # the same messages: their reply channels go on
    board = tree.board.supervisor
    assert board["state"] == "ready" and board["restarts"] == 1 and board["inflight"] == 4
    ref = tree.board.batcher_ref
    assert ref is not None and ref.actor_urn == tree.batcher(2).actor_urn


def test_a_request_whose_future_completed_before_the_crash_is_not_replayed(start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    done, held = tree.submit("done"), tree.submit("held")
    assert generated(tree.told(1)) == ["done", "held"]
    tree.batcher(1).tell(Answer("done"))
    assert done.reply.future.result(timeout=TIMEOUT) == completion("done")
    tree.crash(1)  # its Forget("done") reached the supervisor first: it was told from the same thread
    assert generated(tree.told(2)) == ["held"]
    assert tree.board.supervisor["inflight"] == 1
    assert not held.reply.future.done()


def test_a_request_held_across_a_crash_is_resolved_by_the_restarted_batcher(start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    held = tree.submit("held")
    tree.crash(1)
    assert generated(tree.told(2)) == ["held"]
    assert not held.reply.future.done()
    tree.batcher(2).tell(Answer("held"))
    assert held.reply.future.result(timeout=TIMEOUT) == completion("held")


def test_more_than_max_restarts_within_the_window_and_the_supervisor_gives_up_failing_every_request(
        start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=2, restart_window_s=60.0)  # back-offs 0.05 s, 0.1 s, then it gives up
    held = tree.submit("held")
    for generation in (1, 2, 3):
        assert generated(tree.told(generation)) == ["held"]  # replayed on each restart
        tree.crash(generation)
    with pytest.raises(BatcherUnavailableError, match="failed 3 times in 60s"):
        held.reply.future.result(timeout=TIMEOUT)
    assert tree.board.supervisor["state"] == "failed"  # published before any caller heard of it
    assert tree.board.supervisor["restarts"] == 2 and tree.board.batcher_ref is None
    later = tree.submit("later")
    tree.settle()
    assert later.reply.future.done()  # failed at once, by the supervisor itself
    with pytest.raises(BatcherUnavailableError, match="not running"):
        later.reply.future.result(timeout=0)
    assert not tree.batchers.started[4].is_set()


def test_a_cancel_during_the_restart_back_off_fails_the_request_and_the_next_batcher_never_sees_it(
        start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    cancelled, kept = tree.submit("cancelled"), tree.submit("kept")
    tree.board.hold_at = "restarting"
    tree.crash(1)
    assert tree.board.holding.wait(TIMEOUT)  # batcher 1 is gone, the back-off timer not yet started
    tree.supervisor.tell(Cancel("cancelled"))  # so this is handled before RestartBatcher
    tree.board.release.set()
    with pytest.raises(CancelledError, match="cancelled") as error:
        cancelled.reply.future.result(timeout=TIMEOUT)
    assert error.value.completion is None  # what it generated died with batcher 1
    told = tree.told(2)
    assert generated(told) == ["kept"] and not any(isinstance(m, Cancel) for m in told)
    assert tree.board.supervisor["inflight"] == 1
    tree.batcher(2).tell(Answer("kept"))
    assert kept.reply.future.result(timeout=TIMEOUT) == completion("kept")


def test_a_cancel_forwarded_to_a_batcher_that_dies_before_handling_it_is_not_replayed(
        start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    cancelled, kept = tree.submit("cancelled"), tree.submit("kept")
    release = tree.crash(1, hold=True)  # batcher 1 is busy crashing: what it is told now, it never handles
    tree.supervisor.tell(Cancel("cancelled"))
    tree.settle()  # the Cancel went to batcher 1's inbox
    release.set()
    with pytest.raises(CancelledError) as error:
        cancelled.reply.future.result(timeout=TIMEOUT)
    assert error.value.completion is None  # answered by the supervisor, not by a batcher
    assert generated(tree.told(2)) == ["kept"]


def test_a_cancel_while_a_batcher_runs_is_forwarded_to_it(start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    req = tree.submit("r")
    tree.supervisor.tell(Cancel("r"))
    with pytest.raises(CancelledError) as error:
        req.reply.future.result(timeout=TIMEOUT)
    assert error.value.completion == completion("r", "cancelled")  # the batcher's partial completion
    told = tree.told(1)
    assert generated(told) == ["r"] and told[1:] == [Cancel("r")]
    assert tree.board.supervisor["state"] == "ready" and tree.board.supervisor["restarts"] == 0
