"""Futures chained on the caller's side and texts tokenized in one ``Tokenize`` trip
(``llamactor.handles.batcher_tokens``), over a fake batcher that answers on its own thread."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest

from llamactor.base.completion import Tokenized, TokenizedTexts
from llamactor.base.errors import BatcherUnavailableError, InvalidRequestError
from llamactor.base.messages import Tokenize
from llamactor.handles.batcher_tokens import gather, shielded, then, tokenized

pytestmark = pytest.mark.pure


class FakeBatcher:
    """Answers each ``Tokenize`` of ``texts`` from another thread: one id per character (specials parsed: 0)."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[Tokenize] = []
        self.fail = fail

    def send(self, msg: Any) -> concurrent.futures.Future[Any]:
        assert isinstance(msg, Tokenize) and msg.texts is not None
        self.sent.append(msg)

        def answer() -> None:
            if self.fail:
                msg.reply.fail(BatcherUnavailableError("gone"))
            else:
                assert msg.texts is not None
                msg.reply.resolve(TokenizedTexts(tuple(
                    Tokenized((0,) if parse and text == "<s>" else tuple(map(ord, text)), text)
                    for text, _, parse in msg.texts)))
        threading.Thread(target=answer).start()
        return msg.reply.future


def build(tok: Any) -> list[list[int]]:
    return [tok.tokenize("<s>", add_special=False, parse_special=True),
            tok.tokenize("ab", add_special=False, parse_special=False)]


def test_a_builder_gets_the_batchers_tokens_after_one_trip_for_all_its_texts() -> None:
    batcher = FakeBatcher()
    result, known = tokenized(batcher.send, build).result(timeout=10)
    assert result == [[0], [97, 98]]
    assert [m.texts for m in batcher.sent] == [(("<s>", False, True), ("ab", False, False))]
    assert known[("ab", False, False)] == [97, 98]


def test_known_texts_are_not_asked_again() -> None:
    batcher = FakeBatcher()
    result, _ = tokenized(batcher.send, build, {("<s>", False, True): [5]}).result(timeout=10)
    assert result == [[5], [97, 98]] and [m.texts for m in batcher.sent] == [(("ab", False, False),)]
    every = {("<s>", False, True): [5], ("ab", False, False): [1]}
    assert tokenized(batcher.send, build, every).result(timeout=10)[0] == [[5], [1]] and len(batcher.sent) == 1


def test_a_builder_that_refuses_the_real_tokens_fails_the_future() -> None:
    def too_long(tok: Any) -> None:
        if len(tok.tokenize("abc", add_special=False, parse_special=False)) > 2:
            raise InvalidRequestError("too long", param="documents[0]")
    with pytest.raises(InvalidRequestError, match="too long"):
        tokenized(FakeBatcher().send, too_long).result(timeout=10)


def test_a_failed_trip_fails_the_future_with_its_error() -> None:
    with pytest.raises(BatcherUnavailableError):
        tokenized(FakeBatcher(fail=True).send, build).result(timeout=10)


def test_gather_fails_on_the_first_failure_and_cancels_the_rest() -> None:
    a: concurrent.futures.Future[int] = concurrent.futures.Future()
    b: concurrent.futures.Future[int] = concurrent.futures.Future()
    both = gather([a, b])
    a.set_exception(ValueError("no"))
    with pytest.raises(ValueError):
        both.result(timeout=1)
    assert b.cancelled()


def test_cancelling_a_chained_future_cancels_what_it_waits_for() -> None:
    source: concurrent.futures.Future[int] = concurrent.futures.Future()
    chained = then(source, lambda x: x + 1)
    chained.cancel()
    assert source.cancelled()
    ok: concurrent.futures.Future[int] = concurrent.futures.Future()
    flat = then(ok, lambda x: then(done(x * 2), lambda y: y + 1))
    ok.set_result(3)
    assert flat.result(timeout=1) == 7


def done(value: int) -> concurrent.futures.Future[int]:
    f: concurrent.futures.Future[int] = concurrent.futures.Future()
    f.set_result(value)
    return f


def test_a_shielded_future_resolves_as_its_source_and_cancels_alone() -> None:
    source: concurrent.futures.Future[int] = concurrent.futures.Future()
    first, second = shielded(source), shielded(source)
    assert first.cancel()
    assert not source.cancelled()
    source.set_result(5)
    assert second.result(timeout=1) == 5
