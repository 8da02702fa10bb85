"""The ingress side: ``RemoteReplicas``, the request API over a model's Ray Serve deployment.

The OpenAI app (``llamactor.http.server``) runs unchanged on the ingress replica's event loop; it
calls ``submit``/``stream_async``/``submit_embed`` as on an in-process handle, and ``_send`` turns
each message into a call on the model's ``DeploymentHandle`` (Ray's request router, ours by
default, picks the replica). A plain request whose replica dies is sent again, to another replica;
a stream whose replica dies after it began fails with ``BatcherRestartedError``, as in-process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import structlog
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

from llamactor.client import Client
from llamactor.errors import BatcherRestartedError, BatcherUnavailableError, EngineError, ModelNotFoundError
from llamactor.messages import Embed, Generate, ReplyChannel
from llamactor.model_specs import ModelSpec
from llamactor.rayserve.replica import QUEUED

log = structlog.get_logger("llamactor.rayserve")
REPLICA_LOST = (ActorDiedError, ActorUnavailableError, RayActorError)
MAX_ATTEMPTS = 4  # a request is sent to at most this many replicas in turn


class RemoteReplicas(Client):
    """A model served by a Ray Serve deployment. Methods run on the ingress's event loop, except
    ``replica_stats`` (blocking: call it from a worker thread)."""

    loaded = True  # Ray Serve starts (and autoscales) the replicas; nothing loads on first use

    def __init__(self, spec: ModelSpec, handle: DeploymentHandle) -> None:
        self.spec = spec
        self.name = spec.name
        self.config = spec.config
        self._handle = handle
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def load(self) -> None:
        pass

    def _send(self, msg: Generate | Embed, reply: ReplyChannel) -> concurrent.futures.Future[Any]:
        loop = asyncio.get_running_loop()
        streaming = reply.on_piece is not None
        task = loop.create_task(self._stream(msg, reply) if streaming else self._complete(msg, reply))
        self._tasks[msg.request_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(msg.request_id, None))
        # a caller that cancels its future (a disconnected client) cancels the remote call too
        reply.future.add_done_callback(lambda f: f.cancelled() and loop.call_soon_threadsafe(task.cancel))
        return reply.future

    async def _complete(self, msg: Generate | Embed, reply: ReplyChannel) -> None:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                status, value = await self._handle.complete.remote(msg)
            except REPLICA_LOST as e:
                log.warning("replica_lost", model=self.name, request_id=msg.request_id, attempt=attempt, error=repr(e))
                continue
            except Exception as e:  # noqa: BLE001 - anything else Ray raises ends this request alone
                reply.fail(EngineError(f"the replica failed: {e}"))
                return
            (reply.resolve if status == "ok" else reply.fail)(value)
            return
        reply.fail(BatcherUnavailableError(f"no replica of {self.name!r} could serve the request"))

    async def _stream(self, msg: Generate | Embed, reply: ReplyChannel) -> None:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                pieces: Any = self._handle.options(stream=True).stream.remote(msg)  # a DeploymentResponseGenerator
                async for status, value in pieces:
                    if status == QUEUED:
                        reply.mark_queued()
                    elif status == "piece":
                        reply.send_piece(value.text, value.logprobs)
                    else:
                        (reply.resolve if status == "ok" else reply.fail)(value)
                return
            except REPLICA_LOST as e:
                log.warning("replica_lost", model=self.name, request_id=msg.request_id, attempt=attempt, error=repr(e))
                if reply.n_pieces_sent:  # the client saw text already: cannot restart invisibly
                    reply.fail(BatcherRestartedError("the replica serving this stream died"))
                    return
            except Exception as e:  # noqa: BLE001
                reply.fail(EngineError(f"the replica failed: {e}"))
                return
        reply.fail(BatcherUnavailableError(f"no replica of {self.name!r} could serve the request"))

    def cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.get_loop().call_soon_threadsafe(task.cancel)  # Ray cancels the call on the replica

    def replica_stats(self) -> list[dict[str, Any]]:
        """Stats of the replicas the handle reaches (asked a few times over: Ray picks the replica)."""
        seen: dict[str, dict[str, Any]] = {}
        for _ in range(3 * self.spec.replicas):
            try:
                stats = self._handle.stats.remote().result(timeout_s=30)
            except Exception:  # noqa: BLE001 - a replica being replaced
                continue
            seen[stats["replica_id"]] = stats
            if len(seen) == self.spec.replicas:
                break
        return [seen[k] for k in sorted(seen)]


class RemoteRouter:
    """The ingress's router: the models by name (``ServerState.router``)."""

    def __init__(self, models: list[RemoteReplicas]) -> None:
        self._models = {m.name: m for m in models}
        self.names = list(self._models)

    def model(self, name: str | None = None) -> RemoteReplicas:
        if name is None:
            return next(iter(self._models.values()))
        if name not in self._models:
            raise ModelNotFoundError.among(name, self.names)
        return self._models[name]
