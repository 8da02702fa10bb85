"""How pieces cross from the batcher thread to an event loop's streams: once per batch of pushes
(a decode step's, every stream's), in order, each reader woken once for what arrived for it."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import pickle
import threading
from typing import Any

import pytest

from llamactor.base.completion import Completion, Piece, TokenLogprob
from llamactor.base.messages import ReplyChannel
from llamactor.handles.streams import AsyncTextStream, TextStream, buffered, buffered_check, mailbox_of, merged

from tests.support.dialects import completion

pytestmark = pytest.mark.pure


def _streams(loop: asyncio.AbstractEventLoop, n: int) -> tuple[list[AsyncTextStream], list[Any]]:
    streams, futures = [], []
    for i in range(n):
        stream = AsyncTextStream(f"r{i}", lambda rid: None, loop)
        future: concurrent.futures.Future[Completion] = concurrent.futures.Future()
        queued: concurrent.futures.Future[None] = concurrent.futures.Future()
        queued.set_result(None)
        stream.attach(future, queued)
        streams.append(stream)
        futures.append(future)
    return streams, futures


def test_a_steps_pieces_for_every_stream_cross_to_the_loop_in_one_call_and_each_reader_wakes_once() -> None:
    async def run() -> tuple[int, list[list[list[str]]]]:
        loop = asyncio.get_running_loop()
        streams, futures = _streams(loop, 8)
        calls = 0
        threadsafe = loop.call_soon_threadsafe

        def counted(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            return threadsafe(*args)
        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]

        def batcher_steps() -> None:  # two steps of three pieces a stream, then every stream ends
            for step in range(2):
                for k in range(3):
                    for i, stream in enumerate(streams):
                        stream.push(Piece(f"{i}.{step}.{k} "))
            for i, future in enumerate(futures):
                future.set_result(completion(f"{i}"))

        async def read(stream: AsyncTextStream) -> list[list[str]]:
            return [[p.text for p in batch] async for batch in stream.batches()]
        readers = [asyncio.ensure_future(read(s)) for s in streams]
        await asyncio.sleep(0)  # every reader waits for its first piece
        thread = threading.Thread(target=batcher_steps)  # the loop does not run until it is done
        thread.start()
        thread.join()
        return calls, list(await asyncio.gather(*readers))

    calls, batches = asyncio.run(run())
    # one hop for 48 pieces and 8 ends (before: one call_soon_threadsafe per piece and per end)
    assert calls == 1
    for i, got in enumerate(batches):
        assert got == [[f"{i}.{s}.{k} " for s in range(2) for k in range(3)]]  # one wake-up, in order


def test_the_end_comes_after_every_piece_posted_before_it_and_buffered_says_what_waits() -> None:
    async def run() -> tuple[list[Any], bool, bool]:
        loop = asyncio.get_running_loop()
        (stream,), (future,) = _streams(loop, 1)
        stream.push(Piece("a"))
        stream.push(Piece("b"))
        future.set_result(completion("ab"))
        before = buffered([stream])
        await asyncio.sleep(0)  # the delivery runs
        after = buffered([stream])
        return [u async for u in merged([stream])], before, after

    updates, before, after = asyncio.run(run())
    assert [(i, getattr(u, "text", None)) for i, u in updates] == [(0, "a"), (0, "b"), (0, "ab")]
    assert isinstance(updates[-1][1], Completion) and (before, after) == (False, True)


@pytest.mark.parametrize("choices", [1, 3])
def test_merged_hands_each_finished_choice_to_ended_before_its_reader_sees_it(choices: int) -> None:
    """What the HTTP stream counts in the metrics: every choice's completion, once, before it is
    yielded (one stream is read without a task; several through their pumps)."""
    async def run() -> tuple[list[tuple[str, Any]], list[bool]]:
        loop = asyncio.get_running_loop()
        streams, futures = _streams(loop, choices)
        seen: list[tuple[str, Any]] = []
        check = buffered_check(streams)
        for i, (stream, future) in enumerate(zip(streams, futures)):
            stream.push(Piece(f"p{i}"))
            future.set_result(completion(f"c{i}"))
        waits = [check() == buffered(streams)]
        await asyncio.sleep(0)  # the delivery runs
        waits += [check() == buffered(streams), check()]
        async for index, item in merged(streams, lambda c: seen.append(("ended", c.text))):
            seen.append(("read", (index, item.text)))
        return seen, waits + [check() == buffered(streams), not check()]

    seen, waits = asyncio.run(run())
    assert all(waits)
    for i in range(choices):
        assert seen.count(("ended", f"c{i}")) == 1
        assert seen.index(("ended", f"c{i}")) + 1 == seen.index(("read", (i, f"c{i}")))
        assert seen.index(("read", (i, f"p{i}"))) < seen.index(("ended", f"c{i}"))


def test_the_rest_of_a_batch_merged_is_reading_counts_as_buffered_so_its_frames_join_one_write() -> None:
    """Pieces of several steps that reach a stream in one wake: a writer that asks ``buffered``
    after each piece sees the others still to come, and writes once, after the last."""
    async def run() -> list[tuple[str, bool, bool]]:
        loop = asyncio.get_running_loop()
        (stream,), (future,) = _streams(loop, 1)
        for text in ("a", "b", "c"):
            stream.push(Piece(text))
        future.set_result(completion("abc"))
        check = buffered_check([stream])
        await asyncio.sleep(0)  # one delivery: three pieces and the end
        return [(getattr(item, "text", ""), check(), buffered([stream])) async for _, item in merged([stream])]

    assert asyncio.run(run()) == [("a", True, True), ("b", True, True), ("c", False, False), ("abc", False, False)]


def test_in_place_the_loops_own_posts_arrive_at_once_behind_what_another_thread_posted() -> None:
    """A front-end process hands the link's pieces on in place (``Mailbox.in_place``): they reach
    the stream as they are posted, unless another thread's posts wait to cross -- then they go
    behind them, in order; outside ``in_place`` the loop's own posts wait for the delivery too."""
    async def run() -> tuple[bool, bool, bool, list[str]]:
        loop = asyncio.get_running_loop()
        (stream,), (future,) = _streams(loop, 1)
        box = mailbox_of(loop)
        with box.in_place():
            stream.push(Piece("a"))
        at_once = buffered([stream])
        pusher = threading.Thread(target=stream.push, args=(Piece("b"),))
        pusher.start()
        pusher.join()
        assert box._items  # noqa: SLF001 - the other thread's post waits to cross (the loop has not run)
        with box.in_place():
            stream.push(Piece("c"))
        behind = stream._buffer == collections.deque([Piece("a")])  # noqa: SLF001 - "c" did not pass "b"
        stream.push(Piece("d"))
        waits = stream._buffer == collections.deque([Piece("a")])  # noqa: SLF001
        future.set_result(completion("abcd"))
        return at_once, behind, waits, [p.text async for p in stream.pieces()]

    assert asyncio.run(run()) == (True, True, True, ["a", "b", "c", "d"])


def test_a_closed_loop_refuses_a_piece_so_the_batcher_cancels_the_request() -> None:
    loop = asyncio.new_event_loop()
    (stream,), _ = _streams(loop, 1)
    loop.close()
    with pytest.raises(RuntimeError):
        stream.push(Piece("x"))


def test_a_last_piece_with_only_logprobs_reaches_pieces_but_no_text_reader() -> None:
    """A request's last piece may carry the logprobs of tokens that never became text (a stop
    string's): the HTTP stream reads it through ``pieces()``; a text iterator yields no empty text."""
    held = (TokenLogprob(",", -0.1), TokenLogprob(" six", -0.2))
    reply = ReplyChannel()
    assert not reply.send_piece("", held)  # mid-stream: it waits for the next piece's text
    sent: list[Piece] = []
    assert ReplyChannel(on_piece=sent.append).send_piece("", held, last=True) and sent == [Piece("", held)]

    async def read() -> tuple[list[str], list[Piece]]:
        loop = asyncio.get_running_loop()
        (texts, pieces), futures = _streams(loop, 2)
        for stream, future in zip((texts, pieces), futures):
            stream.push(Piece(" five", (TokenLogprob(" five", -0.3),)))
            stream.push(Piece("", held))
            future.set_result(completion(" five"))
        return [t async for t in texts], [p async for p in pieces.pieces()]

    texts, pieces = asyncio.run(read())
    assert texts == [" five"] and [p.logprobs for p in pieces][1] == held
    sync = TextStream("r", lambda rid: None)
    sync.push(Piece("", held))
    sync.push(Piece(" five"))
    future: concurrent.futures.Future[Completion] = concurrent.futures.Future()
    sync.attach(future)
    future.set_result(completion(" five"))
    assert list(sync) == [" five"]


def test_the_done_flag_follows_the_future_whoever_completes_it_and_a_sent_channel_starts_clear() -> None:
    """The batcher reads ``ReplyChannel.done`` for each running request every step instead of
    taking the future's lock: it is set by whichever thread completes the future."""
    cancelled, answered, failed, broken = ReplyChannel(), ReplyChannel(), ReplyChannel(), ReplyChannel(on_piece=_raise)
    assert not any(r.done for r in (cancelled, answered, failed, broken))
    caller = threading.Thread(target=cancelled.future.cancel)  # the caller gives up, on its own thread
    caller.start()
    caller.join()
    answered.resolve(completion("x"))
    failed.fail(RuntimeError("its own"))
    broken.send_piece("x")  # a consumer that raises: the channel cancels its request
    assert cancelled.done and answered.done and failed.done and broken.done
    assert not pickle.loads(pickle.dumps(answered)).done  # another process's copy: its own future


def _raise(piece: Piece) -> None:
    raise RuntimeError("the consumer went away")
