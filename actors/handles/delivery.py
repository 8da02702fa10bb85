"""``Delivery``: what every llamactor handle is underneath its verbs (``Client``).

The model's defaults (``config``, ``sampling_defaults``, ``tool_format``), where a message goes
(``send`` / ``send_n`` / ``cancel``, a subclass's: one actor tree, a replica, a Ray Serve
deployment), the tenants' rate limits, tracing spans and how a caller waits for a future. Every
method runs on the caller's thread (or event loop); nothing here touches llama.cpp.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from llamactor.base.completion import Completion
from llamactor.base.config import Config
from llamactor.base.messages import CallerMessage, Embed, Generate
from llamactor.base.sampling import SamplingParams
from llamactor.base.tenants import Tenant
from llamactor.base.tool_format import FALLBACK, ToolCallFormat
from llamactor.base.trace_spans import SERVICE_NAME
from llamactor.handles import tracing
from llamactor.handles.limits import Limiter, RateLimiter, WaitForLimits

T = TypeVar("T")  # what a future resolves to: a Completion, Embeddings, a Reranking ...
Future = concurrent.futures.Future


class Delivery:
    """A handle's plumbing. Subclasses set ``config`` (the model's defaults) and implement
    ``send`` and ``cancel``; ``send_n`` when the ``n`` choices of one prompt need to stay together."""

    config: Config
    rate_wait: WaitForLimits | None = None  # how a request over its tenant's rate limits waits; None: refused

    @functools.cached_property
    def limiter(self) -> RateLimiter | None:
        """The rate limits of ``config.tenants``, enforced on this handle's submissions."""
        return Limiter.for_tenants(self.config.tenants)

    def send(self, msg: CallerMessage) -> Future[Any]:
        """Deliver ``msg``; its answer goes to ``msg.reply``, whose future this returns."""
        raise NotImplementedError

    def send_n(self, msgs: Sequence[Generate]) -> list[Future[Completion]]:
        """Deliver the ``n`` choices of one prompt, in order."""
        return [self.send(m) for m in msgs]

    def cancel(self, request_id: str) -> None:
        """End ``request_id`` now; its caller gets ``CancelledError`` holding the partial completion."""
        raise NotImplementedError

    def sampling_defaults(self) -> SamplingParams:
        """What a request's unset sampling fields get: the operator's (``config.sampling``); a
        handle on a loaded model layers the GGUF's own under them (``model_sampling``)."""
        return self.config.sampling

    def tool_format(self) -> ToolCallFormat:
        """How this model writes a tool call (its ``EngineInfo.tool_format``); the Hermes
        fallback where the handle knows no model."""
        return FALLBACK

    # -- internals (caller's thread) --------------------------------------------------------

    def _traced(self, msgs: Sequence[Generate | Embed], futures: list[Future[T]]) -> list[Future[T]]:
        """``futures``, each recording its request's span when done if tracing is on
        (``llamactor.handles.tracing``; its parent: the caller's current OpenTelemetry context)."""
        if (tracer := tracing.active()) is not None:
            tracer.watch(msgs, futures, self.served_name())
        return futures

    def served_name(self) -> str:
        """The model's name as served (a ``ModelClient``'s), else its file's stem: its spans' model."""
        name = getattr(self, "name", None)
        return name if isinstance(name, str) else Path(self.config.model or SERVICE_NAME).name.removesuffix(".gguf")

    def _limited(self, tenant: Tenant, tokens: int, send: Callable[[], list[Future[T]]]) -> list[Future[T]]:
        """``send()``, within the tenant's rate limits if any tenant has some (``Limiter.submit``)."""
        limiter = self.limiter
        return send() if limiter is None else limiter.submit(tenant, tokens, send, self.rate_wait).sent

    def _wait(self, future: Future[T], timeout: float | None) -> T:
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    async def _await(self, future: Future[T]) -> T:
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise


def alone(request_id: str | None, options: Mapping[str, Any]) -> None:
    """A typed request carries everything: refuse options given beside it."""
    if request_id is not None or options:
        raise TypeError("a request object carries its own options and id: pass it alone "
                        f"(got {', '.join(sorted([*options, *(['request_id'] if request_id else [])]))})")

