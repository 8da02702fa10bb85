"""``Limiter``: the tenants' requests and tokens per minute, enforced where requests are submitted
(any caller thread: the pure ``RateLimits`` under a lock). ``Limiter.submit`` is the one way a
request goes out within them: reserved by its estimate -- refused with ``RateLimitError`` before
anything is queued, or for batch work (``WaitForLimits``) delayed until the buckets refill --,
sent, and once it ends settled with its real token count.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from llamactor.base.completion import Completion, Embeddings, Tokenized
from llamactor.base.errors import BatcherUnavailableError, CancelledError, RateLimitError
from llamactor.base.logging import get_logger
from llamactor.base.embedding_request import EmbeddingRequest
from llamactor.base.request import GenerationRequest
from llamactor.base.rerank import RerankArgs, Reranking
from llamactor.base.tenants import Tenant
from llamactor.scheduling.rate_limits import Limits, RateLimits, estimate_tokens

log = get_logger("llamactor.limits")
T = TypeVar("T")  # what a request's ``send`` answers per choice: a future, or a stream holding one


@dataclass(frozen=True, slots=True)
class Reservation:
    tenant: Tenant
    tokens: int
    limits: Limits  # what the tenant has left after it (the x-ratelimit-* headers)


@dataclass(frozen=True, slots=True)
class WaitForLimits:
    """How a request over its tenant's limits waits for the buckets to refill instead of being
    refused (batch work, which has no caller to tell "later"): until ``stop`` is set, calling
    ``on_wait(tenant, seconds)`` before each wait."""

    stop: threading.Event
    on_wait: Callable[[Tenant, float], None] | None = None

    def wait(self, tenant: Tenant, seconds: float) -> None:
        """The waiter's thread: ``seconds`` slept (said first), or ``BatcherUnavailableError`` once stopped."""
        if self.on_wait is not None:
            self.on_wait(tenant, seconds)
        if self.stop.wait(seconds):
            raise BatcherUnavailableError("stopped while waiting for the tenant's rate limits")


class Submitted(NamedTuple, Generic[T]):
    sent: list[T]  # what ``send`` answered
    limits: Limits  # what the tenant has left after it (the x-ratelimit-* headers)


class RateLimiter(Protocol):
    """What submits within the tenants' rate limits: a ``Limiter`` in this process, or a front-end
    process's ``LinkLimiter`` (``llamactor.http.link_state``) over the engine's one ``Limiter``."""

    def submit(self, tenant: Tenant, tokens: int, send: Callable[[], list[T]],
               wait: WaitForLimits | None = None) -> Submitted[T]: ...


def generation_estimate(request: GenerationRequest) -> int:
    chars = len(request.text or "") + sum(len(str(m.get("content") or "")) for m in request.messages or ())
    chars += sum(len(c) for c in request.continuations if isinstance(c, str))
    ids = len(request.token_ids or ()) + sum(len(c) for c in request.continuations if not isinstance(c, str))
    return estimate_tokens(chars, ids, request.params.max_tokens, request.n)


def embedding_estimate(request: EmbeddingRequest) -> int:
    return sum(len(x) // 4 + 1 if isinstance(x, str) else len(x) for x in request.inputs)


def rerank_estimate(args: RerankArgs) -> int:
    """A rerank's prompt tokens: the query (and instruction) once, each document with its
    judging prompt's end (~16 tokens), before anything is tokenized."""
    chars = len(args.query) + len(args.instruction or "") + sum(len(d) for d in args.documents)
    return estimate_tokens(chars, 16 * (len(args.documents) + 1), 0, 0)


def tokenize_estimate(prompt: Any) -> int:
    """Tokens a tokenizer call may charge before it runs: text's characters / 4, token ids as
    they are, a chat's contents (what ``Client.submit_tokenize`` takes)."""
    if isinstance(prompt, str):
        return estimate_tokens(len(prompt), 0, 0, 0)
    parts = list(prompt) if isinstance(prompt, (list, tuple)) else []
    chars = sum(len(p) if isinstance(p, str) else len(str(p.get("content") or "")) if isinstance(p, dict) else 0
                for p in parts)
    return max(1, estimate_tokens(chars, sum(1 for p in parts if isinstance(p, int)), 0, 0))


class Limiter:
    """Rate limits of the tenants that have them; thread-safe."""

    def __init__(self) -> None:
        self._limits = RateLimits()
        self._lock = threading.Lock()

    @classmethod
    def for_tenants(cls, tenants: Sequence[Tenant]) -> Limiter | None:
        """A limiter for ``tenants`` (a handle's ``Config.tenants``); None when none has a limit."""
        limited = any(t.requests_per_minute or t.tokens_per_minute for t in tenants)
        return cls() if limited else None

    def submit(self, tenant: Tenant, tokens: int, send: Callable[[], list[T]],
               wait: WaitForLimits | None = None) -> Submitted[T]:
        """``send()`` within ``tenant``'s limits (the caller's thread): ``tokens`` (an estimate)
        and one request reserved first -- over the limits ``RateLimitError`` before anything is
        sent, or with ``wait`` a wait until they allow it --, then sent, and settled with the
        tokens really used once every future ``send`` answered (or stream's future) is done."""
        reservation = self.reserve(tenant, tokens, wait)
        sent = send()
        self.settle_when_done(reservation, [future_of(s) for s in sent])
        return Submitted(sent, reservation.limits)

    def reserve(self, tenant: Tenant, tokens: int, wait: WaitForLimits | None = None) -> Reservation:
        """What ``tokens`` and one request took of the tenant's limits; over them ``RateLimitError``
        (429), or with ``wait`` a wait until the buckets have refilled enough (``BatcherUnavailableError``
        if ``wait.stop`` is set meanwhile); ``InvalidRequestError`` for what could never fit them."""
        while True:
            try:
                with self._lock:
                    return Reservation(tenant, tokens, self._limits.reserve(tenant, tokens, time.monotonic()))
            except RateLimitError as e:
                if wait is None:
                    raise
                wait.wait(tenant, self._wait_s(tenant, tokens) or float(e.retry_after))

    def _wait_s(self, tenant: Tenant, tokens: int) -> float:
        with self._lock:
            return self._limits.wait_s(tenant, tokens, time.monotonic())

    def settle_when_done(self, reservation: Reservation, futures: Sequence[concurrent.futures.Future[Any]]) -> None:
        """Once every future is done, give back the estimate and take the tokens really used
        (any thread: the futures' callbacks settle it)."""
        if reservation.limits.values:
            when_all_done(futures, lambda used: self.settle(reservation, used))

    def settle(self, reservation: Reservation, used: int) -> None:
        """Any thread: ``reservation``'s request ended having used ``used`` tokens."""
        with self._lock:
            self._limits.settle(reservation.tenant, reservation.tokens, used, time.monotonic())
        # After the request's own request_finished line: a reader of the log (an operator's
        # meter, a test) knows from this one when the tenant's buckets hold what it cost.
        log.info("rate_limit_settled", tenant=reservation.tenant.name, reserved=reservation.tokens, used=used)


def when_all_done(futures: Sequence[concurrent.futures.Future[Any]], then: Callable[[int], None]) -> None:
    """Once every one of ``futures`` is done (none: never), ``then(used_tokens(futures))``, on
    the thread that finished the last."""
    remaining = [len(futures)]
    lock = threading.Lock()

    def done(_: concurrent.futures.Future[Any]) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        then(used_tokens(futures))
    for future in futures:
        future.add_done_callback(done)


def future_of(sent: Any) -> concurrent.futures.Future[Any]:
    """What ``send`` answered for a choice: its future, or a stream's (``TextStream.future``)."""
    return sent if isinstance(sent, concurrent.futures.Future) else sent.future


def used_tokens(futures: Sequence[concurrent.futures.Future[Any]]) -> int:
    """The tokens the finished futures' results report (the prompt once, every choice's output,
    the tokens a tokenizer call made). A choice cancelled once running -- a stream whose caller
    walked away -- counts what it computed and streamed until then (its ``CancelledError``
    holds it); one failed, or cancelled without a trace of its work, counts none."""
    results = [r for r in (_outcome(f) for f in futures) if r is not None]
    completions = [r for r in results if isinstance(r, Completion)]
    embedded = sum(r.prompt_tokens for r in results if isinstance(r, (Embeddings, Reranking)))
    tokenized = sum(len(r.token_ids) for r in results if isinstance(r, Tokenized))
    prompt = max((c.usage.prompt_tokens for c in completions), default=0)
    return embedded + tokenized + prompt + sum(c.usage.completion_tokens for c in completions)


def _outcome(future: concurrent.futures.Future[Any]) -> Any:
    """A done future's result, or the partial completion its cancellation carries, or None."""
    if future.cancelled():
        return None
    error = future.exception()
    if error is None:
        return future.result()
    return error.completion if isinstance(error, CancelledError) else None
