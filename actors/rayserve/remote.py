"""The ingress side: ``RemoteReplicas``, the request API over a model's Ray Serve deployment.

The OpenAI app (``llamactor.http.server``) runs unchanged on the ingress replica's event loop; it
calls ``submit``/``stream_async``/``submit_embed`` as on an in-process handle, and ``send`` /
``send_n`` turn the messages of one request (its ``n`` choices together) into one call on the
model's ``DeploymentHandle`` (Ray's request router, ours by
default, picks the replica). A plain request whose replica dies is sent again, to another replica;
a stream whose replica dies after it began fails with ``BatcherRestartedError`` (its checkpoint died
with the replica; in-process a batcher crash resumes it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from typing import Any

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

from llamactor.base.logging import get_logger
from llamactor.handles.model import ModelClient
from llamactor.base.completion import Completion
from llamactor.base.engine_info import EngineInfo
from llamactor.base.errors import BatcherRestartedError, BatcherUnavailableError, EngineError
from llamactor.base.messages import CallerMessage, Embed, Generate, ReplyChannel
from llamactor.serving.model_specs import ModelSpec, model_named
from llamactor.rayserve.replica import QUEUED

log = get_logger("llamactor.rayserve")
REPLICA_LOST = (ActorDiedError, ActorUnavailableError, RayActorError)
MAX_ATTEMPTS = 4  # a request is sent to at most this many replicas in turn


class RemoteReplicas(ModelClient):
    """A model served by a Ray Serve deployment. Methods run on the ingress's event loop, except
    ``replica_stats`` (blocking: call it from a worker thread)."""

    def __init__(self, spec: ModelSpec, handle: DeploymentHandle) -> None:
        self.spec = spec
        self.name = spec.name
        self.config = spec.config
        self._handle = handle
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._info: EngineInfo | None = None

    @property
    def loaded(self) -> bool:
        """Whether a replica's ``EngineInfo`` is here. Ray Serve starts (and autoscales) the
        replicas; what "loading" leaves to do on first use is asking one for its info, which
        blocks and so must not run on the event loop (Ray refuses a sync ``result()`` there)."""
        return self._info is not None

    def load(self) -> None:
        """Asks a replica for its info (a worker thread: the request path's ``load``)."""
        self.info

    @property
    def info(self) -> EngineInfo:
        """Asked of a replica once, then kept (the first call waits for that answer: never on the
        event loop; front ends call ``load`` in a worker thread first)."""
        if self._info is None:
            self._info = self._handle.info.remote().result(timeout_s=60)
        return self._info

    def send(self, msg: CallerMessage) -> concurrent.futures.Future[Any]:
        return self._run([msg])[0]

    def send_n(self, msgs: Sequence[Generate]) -> list[concurrent.futures.Future[Completion]]:
        """The ``n`` choices in one call, so they reach one replica and share the prompt's KV."""
        return self._run(list(msgs))

    def _run(self, msgs: list[CallerMessage]) -> list[concurrent.futures.Future[Any]]:
        loop = asyncio.get_running_loop()
        replies = [m.reply for m in msgs]
        task = loop.create_task(self._call(msgs, replies))

        def forget(_: asyncio.Task[None]) -> None:
            for msg in msgs:
                self._tasks.pop(msg.request_id, None)

        def cancel_if_cancelled(future: concurrent.futures.Future[Any]) -> None:
            if future.cancelled():  # a caller that cancels its future (a disconnected client)
                loop.call_soon_threadsafe(task.cancel)  # cancels the remote call

        task.add_done_callback(forget)
        for msg, reply in zip(msgs, replies, strict=True):
            self._tasks[msg.request_id] = task
            reply.future.add_done_callback(cancel_if_cancelled)
        return [r.future for r in replies]

    async def _call(self, msgs: list[CallerMessage], replies: list[ReplyChannel]) -> None:
        """One remote ``run`` call for ``msgs``; on a replica's death, the messages not yet ended
        are sent again (to another replica), unless one already streamed text."""
        stream = any(r.on_piece is not None for r in replies)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            waiting = [i for i, r in enumerate(replies) if not r.future.done()]
            if not waiting:
                return
            try:
                events: Any = self._handle.options(stream=True).run.remote([msgs[i] for i in waiting], stream)
                async for j, status, value in events:  # a DeploymentResponseGenerator
                    reply = replies[waiting[j]]
                    if status == QUEUED:
                        reply.mark_queued()
                    elif status == "piece":
                        # as the replica sent it: its last piece may carry logprobs without text
                        reply.send_piece(value.text, value.logprobs, last=True)
                    else:
                        (reply.resolve if status == "ok" else reply.fail)(value)
                return
            except REPLICA_LOST as e:
                log.warning("replica_lost", model=self.name, request_id=msgs[0].request_id, attempt=attempt,
                            error=repr(e))
                for i in waiting:
                    if replies[i].n_pieces_sent:  # the client saw text already: cannot restart invisibly
                        replies[i].fail(BatcherRestartedError("the replica serving this stream died"))
            except Exception as e:  # noqa: BLE001 - anything else Ray raises ends these requests alone
                for reply in replies:
                    reply.fail(EngineError(f"the replica failed: {e}"))
                return
        for reply in replies:
            reply.fail(BatcherUnavailableError(f"no replica of {self.name!r} could serve the request"))

    def cancel(self, request_id: str) -> None:
        """Cancel the remote call carrying ``request_id`` (with ``n`` choices: all of them, as
        they travel in one call)."""
        task = self._tasks.get(request_id)
        if task is not None:
            task.get_loop().call_soon_threadsafe(task.cancel)  # Ray cancels the call on the replica

    def replica_stats(self, *, exact: bool = False) -> list[dict[str, Any]]:
        """Published stats of the replicas the handle reaches (asked a few times over: Ray picks
        the replica; ``exact`` is not offered across processes)."""
        # Under autoscaling there may be up to max_replicas of them
        n_replicas = int((self.spec.autoscaling or {}).get("max_replicas", self.spec.replicas))
        seen: dict[str, dict[str, Any]] = {}
        for _ in range(3 * n_replicas):
            try:
                stats = self._handle.stats.remote().result(timeout_s=30)
            except Exception:  # noqa: BLE001 - a replica being replaced
                continue
            seen[stats["replica_id"]] = stats
            if len(seen) == n_replicas:
                break
        return [seen[k] for k in sorted(seen)]


class RemoteRouter:
    """The ingress's router: the models by name (``ServerState.router``)."""

    def __init__(self, models: list[RemoteReplicas]) -> None:
        self._models = {m.name: m for m in models}
        self.names = list(self._models)

    def model(self, name: str | None = None) -> RemoteReplicas:
        return model_named(self._models, name)
