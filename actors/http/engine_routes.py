"""``GET /engine/events``: the live view of the engine as Server-Sent Events (uvicorn's event
loop), what ``/ui/engine`` and ``llamactor top`` render. Every ``interval_s`` (0.25 s by default:
a few updates a second) one ``data:`` event carries an ``EngineSnapshot`` as JSON, its rates taken
over the last ``RATE_WINDOW_S`` (a step can take longer than one interval on a busy CPU: rates over
a single interval would flicker between 0 and twice the truth). Once keys
exist (``--api-key`` or ``--keys``) it is for admin keys (the middleware). The stream ends when
the client goes (Starlette cancels the body) or the daemon drains.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from llamactor.http.live_snapshot import engine_snapshot
from llamactor.http.state import ServerState, State

router = APIRouter()
ENGINE_EVENTS_PATH = "/engine/events"
RATE_WINDOW_S = 2.0


def read_now(state: ServerState) -> tuple[list[tuple[str, int, dict[str, Any]]], list[dict[str, Any]]]:
    """Every replica's published stats and the unfinished batch jobs (a worker thread: under Ray
    Serve the stats are remote calls, and the jobs are an SQLite read, in a front-end process a
    call to the engine's)."""
    batches = state.jobs.unfinished_batches() if state.jobs is not None else []
    return state.replica_stats(), batches


async def snapshots(state: ServerState, interval_s: float) -> AsyncIterator[str]:
    """One SSE event per interval, each with its rates since the oldest reading in the window."""
    window: collections.deque[tuple[float, Any]] = collections.deque()  # (time, stats), oldest first
    while not state.draining:
        stats, batches = await asyncio.to_thread(read_now, state)
        t = time.monotonic()
        while len(window) > 1 and t - window[1][0] >= RATE_WINDOW_S:
            window.popleft()
        t_before, before = window[0] if window else (t, None)
        snapshot = engine_snapshot(stats, before, t - t_before, state.model_names, batches)
        yield f"data: {snapshot.model_dump_json()}\n\n"
        window.append((t, stats))
        await asyncio.sleep(interval_s)  # a timer, not a poll for an event: the board is read on this beat


@router.get(ENGINE_EVENTS_PATH)
async def engine_events(state: State, interval_s: float = Query(0.25, ge=0.05, le=10)) -> StreamingResponse:
    return StreamingResponse(snapshots(state, interval_s), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
