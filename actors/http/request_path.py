"""What every dialect's handler does with its typed requests, whatever their shape (uvicorn's
event loop).

``planned``: find the model (its name and defaults are the plan's context), plan the body with
them -- every 400 of the body itself, before anything loads -- and load the model off the loop if
needed. The requests go out as the tenant's whose key the request carried (never a value of the
body: the plans know nothing of it), under its priority ceiling. Then either ``answer`` -- submit the requests' choices, await them while watching for a
disconnect (which cancels them) -- or ``stream``: start every choice and wait until each is
accepted by the batcher before the 200, so that a refusal is the dialect's own 4xx, then frame
the dialect's events over their merged pieces. Finished completions are counted in the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from llamactor.base.completion import ChoiceUpdate, Completion, Embeddings, Tokenized
from llamactor.base.config import Config
from llamactor.base.errors import BatcherUnavailableError, CancelledError, InvalidRequestError, ModelLoadError
from llamactor.base.logging import get_logger
from llamactor.base.embedding_request import EmbeddingRequest
from llamactor.base.request import GenerationRequest, choice_request_id
from llamactor.base.tool_format import FALLBACK
from llamactor.dialects.context import RequestContext
from llamactor.handles.limits import RateLimiter, embedding_estimate, generation_estimate, tokenize_estimate
from llamactor.handles.model import ModelClient, check_may_load
from llamactor.handles.streams import AsyncTextStream, buffered_check, merged
from llamactor.http.framing import Framing, OnError, stream_response
from llamactor.base.tenants import Tenant
from llamactor.http.state import ServerState, tenant_of

log = get_logger("llamactor.http")
Observe = Callable[[Completion], None]


class Plan(Protocol):
    @property
    def requests(self) -> list[GenerationRequest]: ...


P = TypeVar("P", bound=Plan)
R = TypeVar("R")  # what one submitted future resolves to


@dataclass(frozen=True, slots=True)
class Planned(Generic[P]):
    """A body planned on its model, which is loaded: what a handler answers or streams."""

    llm: ModelClient
    plan: P
    observe: Observe  # counts a finished completion in the metrics
    tenant: Tenant
    limiter: RateLimiter

    @classmethod
    def of(cls, state: ServerState, request: Request, llm: ModelClient, plan: P, dialect: str) -> Planned[P]:
        tenant = tenant_of(request)
        return cls(llm, plan, state.metrics.observer(llm.name, dialect, tenant.name), tenant, state.limiter)

    @property
    def requests(self) -> list[GenerationRequest]:
        """The plan's requests, as its tenant's."""
        return [r.for_tenant(self.tenant) for r in self.plan.requests]

    def cancel(self) -> None:
        """End every choice of the plan's requests (by their ids: what the batcher cancels)."""
        for r in self.plan.requests:
            for i in range(r.n):
                self.llm.cancel(choice_request_id(r.request_id or "", i, r.n))

    def submit(self, request: Request, submit: Callable[[GenerationRequest], list[Any]]) -> list[Any]:
        """Each request's futures (or streams), within the tenant's rate limits: a 429 before
        anything is queued; what it has left goes out in the response's ``x-ratelimit-*`` headers."""
        out: list[Any] = []
        for r in self.requests:
            started, request.state.rate_limits = self.limiter.submit(self.tenant, generation_estimate(r),
                                                                     functools.partial(submit, r))
            out += started
        return out


async def planned(state: ServerState, request: Request, model: str | None, dialect: str,
                  make_plan: Callable[[RequestContext], P]) -> Planned[P]:
    llm = find_model(state, model)
    plan = make_plan(context(request, llm, model))  # a bad body: 4xx before the model loads
    check_sequences(plan.requests, llm.config)
    if not llm.loaded:
        await load(llm, request)
        plan = make_plan(context(request, llm, model))  # again, in the model's own tool-call format
    return Planned.of(state, request, llm, plan, dialect)


def check_sequences(requests: list[GenerationRequest], config: Config) -> None:
    """A request's sequences (choices x prompts) within ``max_sequences_per_request`` and what the
    queue could ever hold of them at once (each takes a sequence or a place in the queue); else a 400."""
    asked = sum(r.n for r in requests)
    if asked > config.max_sequences_per_request:
        raise InvalidRequestError(f"this request asks for {asked} sequences (n x prompts); this server takes at "
                                  f"most {config.max_sequences_per_request} per request (max_sequences_per_request)")
    if asked > config.max_queue + config.n_parallel:
        raise InvalidRequestError(f"this request asks for {asked} sequences (n x prompts); the model runs "
                                  f"{config.n_parallel} at once and queues at most {config.max_queue}: it could never "
                                  "be queued whole; ask for fewer")


async def stream(request: Request, call: Planned[P],
                 make_events: Callable[[P, AsyncGenerator[ChoiceUpdate, None]], Any], framing: Framing,
                 on_error: OnError, background: BackgroundTask | None = None) -> StreamingResponse:
    """The dialect's events over the plan's streamed choices (accepted before this returns)."""
    streams = await start_streams(request, call)
    updates = _observed(streams, call.observe)
    return stream_response(make_events(call.plan, updates), framing, on_error, updates, background,
                           buffered_check(streams))


async def respond(request: Request, call: Planned[P], streamed: bool,
                  make_events: Callable[[P, AsyncGenerator[ChoiceUpdate, None]], Any], framing: Framing,
                  on_error: OnError, reply: Callable[[P, list[Completion]], Any]) -> Any:
    """The plan's answer: its events streamed, or its reply once every choice is done -- a
    ``JSONResponse`` of the dialect's dict (plain JSON values), the bytes FastAPI would make of it
    without its ``jsonable_encoder`` walk over every value (~70 µs a reply)."""
    if streamed:
        return await stream(request, call, make_events, framing, on_error)
    return JSONResponse(reply(call.plan, await answer(request, call)))


def warn_ignored(dialect: str, fields: list[str], request_id: str) -> None:
    """One warning per request naming the fields given that change nothing here."""
    if fields:
        log.warning("request_fields_ignored", dialect=dialect, fields=fields, request_id=request_id)


def find_model(state: ServerState, name: str | None) -> ModelClient:
    """The model the request names (``ModelNotFoundError``: 404), not loaded yet."""
    router = state.router
    if router is None or state.draining:
        raise BatcherUnavailableError("the server is starting or shutting down")
    return state.model(router, name)


async def load(llm: ModelClient, request: Request) -> ModelClient:
    """``llm``, loaded (off the event loop) if it was not -- when the caller may load it: with
    ``load_on_request`` "admins" (the default) a tenant's request for an unloaded model is a 503
    saying so (loading may evict another tenant's model: ``/models/load`` is an admin's)."""
    if not llm.loaded:
        tenant = tenant_of(request)
        check_may_load(llm, tenant)
        try:
            await asyncio.to_thread(llm.load)
        except ModelLoadError as e:
            if tenant.admin:
                raise
            raise _as_tenants_see_it(e) from e
    return llm


def _as_tenants_see_it(e: ModelLoadError) -> ModelLoadError:
    """A failed load as a tenant reads it: the file named alone, never the folders it sits in (as
    ``/v1/models`` names it); admins and the ``model_load_failed`` log line have the whole path. Its
    class stays (a ``SequenceLimitError``'s code and limit are the tenant's to read too)."""
    path = e.details.get("path")
    message = str(e).replace(path, os.path.basename(path)) if isinstance(path, str) and path else str(e)
    return type(e)(message, **{k: v for k, v in e.details.items() if k != "path"})


async def ready_model(state: ServerState, request: Request, name: str | None) -> ModelClient:
    return await load(find_model(state, name), request)


def context(request: Request, llm: ModelClient, name: str | None = None) -> RequestContext:
    """The request as the dialects see it: the app's id for it, the model's name, sampling defaults
    and tool-call format (known once it is loaded: the GGUF's sampling under the operator's, the
    model's own format; until then the operator's and the fallback, and callers plan again),
    its LoRA adapters and the one ``name`` picks (vLLM's convention: answers name the adapter)."""
    adapters = llm.config.lora_names
    adapter = name if name in adapters and name != llm.name else None
    loaded = llm.loaded
    return RequestContext(request.state.request_id, adapter or llm.name,
                          llm.sampling_defaults() if loaded else llm.config.sampling, adapters=adapters,
                          adapter=adapter, tool_format=llm.tool_format() if loaded else FALLBACK)


async def answer(request: Request, call: Planned[P]) -> list[Completion]:
    """Every choice of every request, in order (cancelled if the client disconnects first: through
    the model, so that the tenant is charged what they had computed, as a stream is)."""
    done: list[Completion] = await gather(request, call.submit(request, call.llm.submit), call.cancel)
    for c in done:
        call.observe(c)
    return done


async def embed(state: ServerState, request: Request, llm: ModelClient, embedding: EmbeddingRequest) -> Embeddings:
    """The embeddings of the tenant's request, within its rate limits."""
    tenant_embedding = dataclasses.replace(embedding, tenant=tenant_of(request))
    return await _limited(request, state.limiter, embedding_estimate(tenant_embedding),
                          lambda: llm.submit_embed(tenant_embedding))


async def tokenize(state: ServerState, request: Request, llm: ModelClient, prompt: Any, **options: Any) -> Tokenized:
    """One trip to the model's tokenizer for the tenant, within its requests and tokens per minute
    (it is engine work like a prompt's: the tokens it tokenizes are charged)."""
    return await _limited(request, state.limiter, tokenize_estimate(prompt),
                          lambda: llm.submit_tokenize(prompt, **options))


async def _limited(request: Request, limiter: RateLimiter, tokens: int, submit: Callable[[], Future[R]]) -> R:
    """The result of ``submit()``, sent within the rate limits of the tenant whose key the request
    carried (a 429 before it is queued; what it has left goes out in the ``x-ratelimit-*`` headers)."""
    (future,), request.state.rate_limits = limiter.submit(tenant_of(request), tokens, lambda: [submit()])
    (result,) = await gather(request, [future])
    return result  # type: ignore[no-any-return]


async def open_stream(request: Request, call: Planned[P]) -> AsyncGenerator[ChoiceUpdate, None]:
    """Start the requests' streams (``start_streams``); their pieces, merged (choice ``k`` of all
    the requests' choices in order)."""
    return _observed(await start_streams(request, call), call.observe)


async def start_streams(request: Request, call: Planned[P]) -> list[AsyncTextStream]:
    """Start the requests' streams; before the 200: every choice accepted by the batcher, or the
    first refusal raised (its 4xx, as without ``stream``) and the other choices cancelled."""
    streams: list[AsyncTextStream] = []
    try:
        streams += call.submit(request, call.llm.stream_async)
        await asyncio.gather(*(s.queued() for s in streams))
    except BaseException:
        for s in streams:
            s.cancel()
        raise
    return streams


def _observed(streams: list[AsyncTextStream], observe: Observe) -> AsyncGenerator[ChoiceUpdate, None]:
    """The streams' pieces merged, each finished completion counted (closing this cancels what still runs)."""
    return merged(streams, observe)


async def gather(request: Request, futures: list[Any], cancel: Callable[[], None] | None = None) -> list[Any]:
    """Await the results; if the client disconnects first, cancel them: with ``cancel`` (the
    requests' own, through the model), their batcher ends them and answers each with what it had
    computed, which the tenant's rate limits charge when it comes (a step or so later: nobody
    waits for it); without, the futures are cancelled here (and nothing is charged)."""
    work: asyncio.Future[Any] = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    disconnect: asyncio.Future[Any] = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            if cancel is not None:
                cancel()  # (not the futures: cancelled here, they would never hear what was used)
                work.add_done_callback(_collect)
                raise CancelledError("the client disconnected")
            for f in futures:
                f.cancel()
            work.cancel()
            with contextlib.suppress(BaseException):  # collect the gather's CancelledError: nobody else will
                await work
            raise CancelledError("the client disconnected")
        if work.exception() is not None:  # one choice refused or failed: the others are not wanted
            for f in futures:
                f.cancel()
        return work.result()  # type: ignore[no-any-return]
    finally:
        disconnect.cancel()


def _collect(work: asyncio.Future[Any]) -> None:
    """Retrieve the gather's outcome once the cancelled choices have ended: nobody else will."""
    if not work.cancelled():
        work.exception()


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
