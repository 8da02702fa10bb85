"""What every dialect's handler does with a request, whatever its shape (uvicorn's event loop).

Find the model (loading it off the loop if needed), submit the choices, await them while
watching for a disconnect (which cancels them), or, for a stream, wait until every choice is
accepted by the batcher before the 200 so that a refusal is the dialect's own 4xx.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from fastapi import Request

from llamactor.base.completion import Completion
from llamactor.base.errors import BatcherUnavailableError, CancelledError
from llamactor.handles.model import ModelClient
from llamactor.handles.streams import AsyncTextStream
from llamactor.http.state import ServerState

async def ready_model(state: ServerState, model: str | None) -> ModelClient:
    """The model the request names (404 if none), loaded (off the event loop) if it was not."""
    router = state.router
    if router is None or state.draining:
        raise BatcherUnavailableError("the server is starting or shutting down")
    handle = state.model(router, model)  # ModelNotFoundError: 404
    if not handle.loaded:
        await asyncio.to_thread(handle.load)
    return handle


async def complete(request: Request, observe: Callable[[Completion], None],
                   submit: Callable[[], list[Any]]) -> list[Completion]:
    """Submit the choices, await them (cancelling on disconnect), count them in the metrics."""
    done = await gather(request, submit())
    for c in done:
        observe(c)
    return done


async def all_queued(starts: list[Callable[[], list[AsyncTextStream]]]) -> list[AsyncTextStream]:
    """Start the streams; before the 200: every choice accepted by the batcher, or the first
    refusal raised (its 4xx, as without ``stream``) and the other choices cancelled."""
    streams: list[AsyncTextStream] = []
    try:
        for start in starts:
            streams += start()
        await asyncio.gather(*(s.queued() for s in streams))
    except BaseException:
        for s in streams:
            s.cancel()
        raise
    return streams


async def gather(request: Request, futures: list[Any]) -> list[Any]:
    """Await the results; if the client disconnects first, cancel them."""
    work: asyncio.Future[Any] = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    disconnect: asyncio.Future[Any] = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
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


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
