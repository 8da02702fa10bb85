"""Futures chained on the caller's side, and texts tokenized by the batcher for code that wants a
tokenizer at hand (the rerank's prompt and pairs).

The caller's side holds no vocabulary: only the batcher calls llama.cpp (its preparation pool, off
its thread), and one ``Tokenize`` trip answers many texts. ``tokenized(send, build, known)`` runs
``build(tokenizer)`` twice: first over a tokenizer that records the texts it is asked for
(answering ``[]``), then -- once the batcher has tokenized those texts, all in one message -- over
one that answers them. ``build`` must ask the
same texts both times (pure code over its arguments does), all of them before it may raise. Callbacks run on whichever thread
settles a future: the batcher's, or a caller's that cancels.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from llamactor.base.completion import TokenizedTexts
from llamactor.base.errors import LlamactorError
from llamactor.base.messages import CallerMessage, ReplyChannel, Tokenize
from llamactor.base.request import new_request_id

T = TypeVar("T")
U = TypeVar("U")
Future = concurrent.futures.Future
TokensKey = tuple[str, bool, bool]  # text, add_special, parse_special
Send = Callable[[CallerMessage], "Future[Any]"]


def settle(out: Future[T], run: Callable[[], T | Future[T]]) -> None:
    """``out`` gets what ``run`` returns (a value, or what a returned future resolves to) or raises."""
    if out.done():
        return
    try:
        value = run()
    except BaseException as e:  # noqa: BLE001 - the caller reads it from the future
        resolve(out, error=e)
        return
    if isinstance(value, concurrent.futures.Future):
        forward(value, out)
    else:
        resolve(out, value)


def resolve(out: Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    """Set ``out`` unless it is done already (two threads may settle it at once: the first wins)."""
    try:
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass


def forward(source: Future[T], out: Future[T], *, cancels: bool = True) -> None:
    """``out`` resolves as ``source`` does; cancelling ``out`` cancels ``source`` (unless not ``cancels``)."""
    if cancels:
        out.add_done_callback(lambda o: source.cancel() if o.cancelled() else None)

    def done(f: Future[T]) -> None:
        if f.cancelled():
            out.cancel()
        else:
            resolve(out, None if f.exception() else f.result(), f.exception())
    source.add_done_callback(done)


def shielded(source: Future[T]) -> Future[T]:
    """A future that resolves as ``source`` does, but whose cancelling leaves ``source`` alone (a
    future shared by several callers)."""
    out: Future[T] = concurrent.futures.Future()
    forward(source, out, cancels=False)
    return out


def then(source: Future[T], fn: Callable[[T], U | Future[U]]) -> Future[U]:
    """A future of ``fn(result)`` (flattened when ``fn`` answers a future); a failure or
    cancellation passes through, and cancelling it cancels ``source``."""
    out: Future[U] = concurrent.futures.Future()
    out.add_done_callback(lambda o: source.cancel() if o.cancelled() else None)

    def done(f: Future[T]) -> None:
        if f.cancelled():
            out.cancel()
        elif (e := f.exception()) is not None:
            resolve(out, error=e)
        else:
            settle(out, lambda: fn(f.result()))
    source.add_done_callback(done)
    return out


def gather(futures: Sequence[Future[T]]) -> Future[list[T]]:
    """A future of every result in order; the first failure fails it and cancels the rest, and
    cancelling it cancels them all."""
    out: Future[list[T]] = concurrent.futures.Future()
    if not futures:
        out.set_result([])
        return out
    remaining = [len(futures)]
    lock = threading.Lock()

    def cancel_all(o: Future[list[T]]) -> None:
        if o.cancelled() or o.exception() is not None:
            for f in futures:
                f.cancel()

    def done(f: Future[T]) -> None:
        if f.cancelled():
            resolve(out, error=concurrent.futures.CancelledError())
            return
        if (error := f.exception()) is not None:
            resolve(out, error=error)
            return
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            settle(out, lambda: [g.result() for g in futures])

    out.add_done_callback(cancel_all)
    for f in futures:
        f.add_done_callback(done)
    return out


class _Recording:
    """First pass: answers known texts, records the others (answering ``[]``)."""

    def __init__(self, known: Mapping[TokensKey, list[int]]) -> None:
        self.known = known
        self.asked: dict[TokensKey, None] = {}

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        key = (text, add_special, parse_special)
        if key in self.known:
            return list(self.known[key])
        self.asked[key] = None
        return []


class _Answering:
    """Second pass: answers every text from what the batcher tokenized."""

    def __init__(self, known: Mapping[TokensKey, list[int]]) -> None:
        self.known = known

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return list(self.known[(text, add_special, parse_special)])


def tokenize_texts(send: Send, keys: Sequence[TokensKey]) -> Future[dict[TokensKey, list[int]]]:
    """The tokens of each text, all in one ``Tokenize`` trip (``texts``): a rerank of N documents
    is one message through the supervisor and the batcher, not N."""
    if not keys:
        done: Future[dict[TokensKey, list[int]]] = concurrent.futures.Future()
        done.set_result({})
        return done
    answered: Future[TokenizedTexts] = send(Tokenize(request_id=new_request_id(), reply=ReplyChannel(), texts=tuple(keys)))
    return then(answered, lambda done: {k: list(t.token_ids) for k, t in zip(keys, done.each, strict=True)})


def tokenized(send: Send, build: Callable[[Any], T], known: Mapping[TokensKey, list[int]] | None = None,
              ) -> Future[tuple[T, dict[TokensKey, list[int]]]]:
    """``build(tokenizer)`` over texts the batcher tokenized (``known`` ones are not asked again),
    with every text's tokens it used."""
    recording = _Recording(known or {})
    try:
        build(recording)
    except LlamactorError:
        pass  # decided on empty tokens: the second pass, on the real ones, decides again
    asked = list(recording.asked)

    def second(fresh: dict[TokensKey, list[int]]) -> tuple[T, dict[TokensKey, list[int]]]:
        tokens = {**(known or {}), **fresh}
        return build(_Answering(tokens)), tokens
    return then(tokenize_texts(send, asked), second)
