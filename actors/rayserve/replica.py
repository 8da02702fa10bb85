"""``ReplicaServer``: the body of one Ray Serve replica, holding one llamactor actor tree.

Ray Serve runs its methods on the replica's event loop. Messages arrive pickled from the ingress
(their ``ReplyChannel`` arrives empty: see ``ReplyChannel.__reduce__``) and get a reply channel
here; llama.cpp is still only called by the tree's batcher actor. A request the tree refuses comes
back as ``("error", exception)`` rather than raised, so the ingress re-raises the very llamactor
error (and its HTTP status) instead of Ray's wrapper around it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from llamactor.api import start_tree
from llamactor.completion import Piece
from llamactor.errors import LlamactorError
from llamactor.logging import configure_default
from llamactor.messages import Embed, Generate, ReplyChannel
from llamactor.model_specs import ModelSpec

QUEUED = "queued"  # a stream's first item: the tree accepted the request


class ReplicaServer:
    """One replica: ``complete`` and ``embed`` answer once, ``stream`` yields pieces."""

    def __init__(self, spec: ModelSpec) -> None:
        configure_default()
        self.spec = spec
        self.llm = start_tree(spec.config)

    async def complete(self, msg: Generate | Embed) -> tuple[str, Any]:
        reply = ReplyChannel()
        future = self.llm._send(dataclasses.replace(msg, reply=reply), reply)
        try:
            return "ok", await asyncio.wrap_future(future)
        except LlamactorError as e:
            return "error", e
        except asyncio.CancelledError:  # the ingress cancelled (its client went away)
            self.llm.cancel(msg.request_id)
            raise

    async def stream(self, msg: Generate) -> AsyncIterator[tuple[str, Any]]:
        """Yields ``("queued", None)``, then ``("piece", Piece)``s, then ``("ok", Completion)``;
        or ``("error", e)`` at any point."""
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[Piece] = asyncio.Queue()
        reply = ReplyChannel(on_piece=lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece))
        future = asyncio.wrap_future(self.llm._send(dataclasses.replace(msg, reply=reply), reply))
        try:
            try:
                await asyncio.wrap_future(reply.queued)
            except LlamactorError as e:
                yield "error", e
                return
            yield QUEUED, None
            while not future.done() or not pieces.empty():
                next_piece = asyncio.ensure_future(pieces.get())
                await asyncio.wait({next_piece, future}, return_when=asyncio.FIRST_COMPLETED)
                if next_piece.done():
                    yield "piece", next_piece.result()
                else:
                    next_piece.cancel()
            try:
                yield "ok", future.result()
            except LlamactorError as e:
                yield "error", e
        finally:
            if not future.done():  # the consumer went away mid-stream
                self.llm.cancel(msg.request_id)

    def stats(self) -> dict[str, Any]:
        from ray import serve  # only ever called inside a Ray Serve replica

        return {**self.llm.stats(), "replica_id": serve.get_replica_context().replica_id.unique_id}

    def info(self) -> Any:
        return self.llm.info

    def __del__(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
