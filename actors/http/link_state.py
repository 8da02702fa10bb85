"""A front-end process's view of what the front ends share in the engine's process
(``engine_state``; docs/operations.md, *Front-end processes*): ``LinkLimiter``, the tenants'
rate limits, and ``LinkResponses``, the stored responses -- what ``use_engine_state`` puts in the
app's ``ServerState`` in place of its own, so that N front-end processes count a tenant once and
share its conversations.

``LinkLimiter.submit`` keeps ``Limiter.submit``'s contract without a round trip: the messages its
``send()`` makes are collected (``COLLECTING``: ``EngineConnection.send`` looks there) and leave
in one ``LIMITED`` frame with the tenant and the estimate; the engine reserves as it reads it --
a refusal fails every message with the 429 (or 400) before anything is queued, which the routes
meet where they meet any refusal, before a stream starts. Once what ``send()`` answered has ended
(a rerank's later requests, sent from callbacks, included), the tokens it used are counted here as
one process counts them and a ``SETTLE`` frame settles the group there.
What the tenant has left (the ``x-ratelimit-*`` headers) arrives before the messages' first reply
and fills the ``Limits`` returned. Nothing here waits for the limits: the batch lines that do
(``WaitForLimits``) run in the engine's process (``engine_jobs``), against its ``Limiter`` itself.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from llamactor.base.tenants import Tenant
from llamactor.handles.limits import Submitted, WaitForLimits, future_of, when_all_done
from llamactor.http.responses_store import Previous, Stored
from llamactor.scheduling.rate_limits import Limits

T = TypeVar("T")
Sends = list[tuple[str, list[tuple[int, Any]], bool]]  # (model, [(token, message)], stream) per SEND


class Collector:
    """The sends of the ``LinkLimiter.submit`` running in this context: where ``EngineConnection.send``
    puts a message instead of sending it alone -- while ``open``: a callback that copied the context
    meanwhile and sends later (an event loop's) must not add to a frame already gone."""

    __slots__ = ("sends", "open")

    def __init__(self) -> None:
        self.sends: Sends = []
        self.open = True

    def collects(self) -> Sends | None:
        return self.sends if self.open else None


COLLECTING: contextvars.ContextVar[Collector | None] = contextvars.ContextVar("llamactor_link_collecting", default=None)


def collecting() -> Sends | None:
    """Where a message sent now goes with its request's others (None: alone)."""
    collector = COLLECTING.get()
    return None if collector is None else collector.collects()


class Link(Protocol):
    """What of ``link_client.EngineConnection`` this module uses."""

    async def call_async(self, method: str, *args: Any) -> Any: ...

    def send_limited(self, sends: Sends, tenant: Tenant, tokens: int) -> tuple[int, Limits]: ...

    def settle(self, group: int, used: int) -> None: ...

    def drop(self, sends: Sends, error: BaseException) -> None: ...


class LinkLimiter:
    """The engine's ``Limiter``, as a ``RateLimiter`` of this front end (caller threads, the event loop)."""

    def __init__(self, link: Link) -> None:
        self._link = link

    def submit(self, tenant: Tenant, tokens: int, send: Callable[[], list[T]],
               wait: WaitForLimits | None = None) -> Submitted[T]:
        """``send()``'s messages in one frame, reserved, refused or settled there (above). A tenant
        without limits sends as it would; a submit inside another (a handle's limiter under the
        app's) is the outer one's: its messages join the outer frame, counted once. ``wait``: a front
        end runs no batch lines, the only callers that wait for their limits (``TypeError``)."""
        if wait is not None:
            raise TypeError("a front end's limiter never waits: batch lines run in the engine's process")
        if (tenant.requests_per_minute is None and tenant.tokens_per_minute is None) or collecting() is not None:
            return Submitted(send(), Limits())
        collector = Collector()
        sends, context = collector.sends, COLLECTING.set(collector)
        try:
            sent = send()
        except BaseException as e:
            self._link.drop(sends, e)
            raise
        finally:
            collector.open = False
            COLLECTING.reset(context)
        group, limits = self._link.send_limited(sends, tenant, tokens)
        futures = [future_of(s) for s in sent]
        if futures:
            when_all_done(futures, lambda used: self._link.settle(group, used))
        else:  # nothing to wait for: the estimate stays spent, as in one process
            self._link.settle(group, tokens)
        return Submitted(sent, limits)


class LinkResponses:
    """The engine's stored responses, as this front end's ``Responses`` (uvicorn's event loop)."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def get(self, tenant: str, response_id: str) -> Stored | None:
        stored: Stored | None = await self._link.call_async("response_get", tenant, response_id)
        return stored

    async def put(self, tenant: str, response: dict[str, Any], messages: Sequence[dict[str, Any]],
                  previous: Previous | None = None) -> None:
        """Only what follows the previous response's conversation crosses, where the engine still
        holds it as it was; else the whole."""
        if previous is not None and await self._link.call_async(
                "response_put", tenant, response, list(messages[previous[1]:]), previous):
            return
        await self._link.call_async("response_put", tenant, response, list(messages), None)

    async def delete(self, tenant: str, response_id: str) -> bool:
        return bool(await self._link.call_async("response_delete", tenant, response_id))


def use_engine_state(state: Any, link: Link) -> None:
    """``state`` (a front-end process's ``ServerState``) counts its tenants' limits and keeps its
    responses in the engine's process."""
    state.limiter = LinkLimiter(link)
    state.responses = LinkResponses(link)
