"""``ReplicaServer``: the body of one Ray Serve replica, holding one llamactor actor tree.

Ray Serve runs its methods on the replica's event loop. Messages arrive pickled from the ingress
(their ``ReplyChannel`` arrives empty: see ``ReplyChannel.__reduce__``) and get a reply channel
here; llama.cpp is still only called by the tree's batcher actor. A request the tree refuses comes
back as an ``"error"`` event rather than raised, so the ingress re-raises the very llamactor
error (and its HTTP status) instead of Ray's wrapper around it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

from llamactor.base.completion import Piece
from llamactor.base.engine_info import EngineInfo
from llamactor.handles.llm import start_tree
from llamactor.base.logging import configure_from_env
from llamactor.base.messages import CallerMessage, Embed, Generate, ReplyChannel
from llamactor.serving.model_specs import ModelSpec

QUEUED = "queued"  # a request's first event: the tree accepted it


class ReplicaServer:
    """One replica: ``run`` serves the messages of one call (one request, or the ``n`` choices of
    one prompt, which stay on this replica and share its prompt's KV)."""

    def __init__(self, spec: ModelSpec) -> None:
        configure_from_env()  # this Ray worker process is ours: its entry point
        self.spec = spec
        self.llm = start_tree(spec.config)

    async def run(self, msgs: list[CallerMessage], stream: bool) -> AsyncIterator[tuple[int, str, Any]]:
        """Yields ``(i, "queued", None)`` once message ``i`` is accepted, ``(i, "piece", Piece)``s
        (with ``stream``), then ``(i, "ok", result)`` or ``(i, "error", exception)``."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()

        def put(*event: Any) -> None:  # from the batcher's thread or this loop
            loop.call_soon_threadsafe(events.put_nowait, event)

        def on_queued(i: int) -> Any:
            return lambda f: put(i, QUEUED, None) if f.exception() is None else None

        def on_done(i: int) -> Any:
            return lambda f: put(i, "error", f.exception()) if f.exception() is not None else put(i, "ok", f.result())

        def on_piece(i: int) -> Callable[[Piece], None]:
            return lambda piece: put(i, "piece", piece)

        replies = [ReplyChannel(on_piece=on_piece(i) if stream else None) for i in range(len(msgs))]
        futures = []
        for i, (msg, reply) in enumerate(zip(msgs, replies, strict=True)):
            reply.queued.add_done_callback(on_queued(i))
            futures.append(self.llm.send(dataclasses.replace(msg, reply=reply)))
            futures[-1].add_done_callback(on_done(i))
        n_ended = 0
        try:
            while n_ended < len(msgs):
                event = await events.get()
                n_ended += event[1] in ("ok", "error")  # a message's last event
                yield event
        finally:
            for msg, future in zip(msgs, futures):
                if not future.done():  # the consumer went away mid-stream
                    self.llm.cancel(msg.request_id)

    def stats(self) -> dict[str, Any]:
        from ray import serve  # only ever called inside a Ray Serve replica

        return {**self.llm.published_stats(), "replica_id": serve.get_replica_context().replica_id.unique_id}

    def info(self) -> EngineInfo:
        return self.llm.info

    def __del__(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
