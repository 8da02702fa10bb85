"""Scoring a rerank's documents (``handles/rerank.py``, step 3): the documents in groups of at most
``n_parallel``, each group ONE ``GenerationRequest`` whose choices continue the shared context with
a document and the judging template's end, answered by the choices' label probabilities (P(yes) /
(P(yes) + P(no))). At most ``WINDOW_GROUPS`` groups wait at once, so a long list never fills the
tenant's share of the queue; a group the full queue refused is sent again while others of the
rerank still run.

Runs on the caller's thread (``start``) and then on the threads that answer the groups' futures
(the batcher's); the lock guards what both touch.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from llamactor.base.completion import Completion
from llamactor.base.config import Config
from llamactor.base.errors import QueueFullError
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.base.request import MAX_CHOICES, GenerationRequest
from llamactor.base.sampling import SamplingParams
from llamactor.base.tenants import Tenant
from llamactor.handles.batcher_tokens import Future, resolve

Labels = tuple[tuple[int, ...], tuple[int, ...]]
WINDOW_GROUPS = 2  # groups of one rerank waiting at once


class ScoringClient(Protocol):
    """What scoring needs of its handle."""

    config: Config

    def send_n(self, msgs: Sequence[Generate]) -> list[Future[Completion]]: ...

    def sampling_defaults(self) -> SamplingParams: ...


class Scoring:
    """The documents' scores: groups sent as room allows, each answered by its choices' label
    probabilities; a choice the full queue refused is sent again while others still run."""

    def __init__(self, client: ScoringClient, context: list[int], continuations: Sequence[tuple[int, ...]], labels: Labels,
                 *, tenant: Tenant, priority: int, request_id: str) -> None:
        self.client, self.context, self.continuations, self.labels = client, context, continuations, labels
        self.tenant, self.priority, self.request_id = tenant, priority, request_id  # each group's request carries them
        # A group as large as the sequences that run at once (more would only wait), and the
        # rerank's waiting documents an eighth of the queue at most: eight reranks of any length
        # at once fit a tenant's share of it.
        config = client.config
        self.group_size = max(1, min(MAX_CHOICES, config.n_parallel, config.max_queue // (4 * WINDOW_GROUPS)))
        self.scores: list[float | None] = [None] * len(continuations)
        self.waiting = collections.deque(range(len(continuations)))
        self.running: dict[int, list[Future[Completion]]] = {}
        self.n_groups = 0
        self.lock = threading.Lock()
        self.out: Future[list[float]] = concurrent.futures.Future()
        self.out.add_done_callback(self._on_out_done)

    def start(self) -> Future[list[float]]:
        self._pump()
        return self.out

    def _pump(self) -> None:
        """Send groups while fewer than ``WINDOW_GROUPS`` run (any thread)."""
        while True:
            with self.lock:
                if self.out.done() or not self.waiting or len(self.running) >= WINDOW_GROUPS:
                    return
                indices = [self.waiting.popleft() for _ in range(min(self.group_size, len(self.waiting)))]
                group = self.n_groups
                self.n_groups += 1
                self.running[group] = []
            try:
                self._send(group, indices)
            except BaseException as e:  # noqa: BLE001 - the rerank fails with it
                resolve(self.out, error=e)
                return

    def _send(self, group: int, indices: list[int]) -> None:
        request = GenerationRequest.build(
            self.client.sampling_defaults(), prompt=self.context, n=len(indices), max_tokens=0, temperature=0.0,
            continuations=[self.continuations[i] for i in indices], label_token_ids=self.labels,
            priority=self.priority, tenant=self.tenant)
        rid = f"{self.request_id}-g{group}"
        futures = self.client.send_n(request.generate_messages(rid, [ReplyChannel() for _ in indices],
                                                               time.perf_counter()))
        with self.lock:
            self.running[group] = futures
        remaining = [len(futures)]

        def done(_: Future[Completion]) -> None:
            self._choice_done(group, indices, remaining)
        for future in futures:
            future.add_done_callback(done)

    def _choice_done(self, group: int, indices: list[int], remaining: list[int]) -> None:
        with self.lock:
            remaining[0] -= 1
            if remaining[0]:
                return
            futures = self.running.pop(group)
        try:
            finished = self._group_done(indices, futures)
        except BaseException as e:  # noqa: BLE001 - the rerank fails with it
            resolve(self.out, error=e)
            return
        if finished:
            resolve(self.out, [s for s in self.scores if s is not None])
        else:
            self._pump()

    def _group_done(self, indices: list[int], futures: list[Future[Completion]]) -> bool:
        """Record a finished group's scores and queue again its choices the full queue refused
        (raises the first other failure); whether every document is scored."""
        refused = []
        for index, future in zip(indices, futures, strict=True):
            if not future.cancelled() and isinstance(future.exception(), QueueFullError):
                refused.append(index)
            else:
                self.scores[index] = _score(future.result())  # a failure or cancellation raises
        with self.lock:
            if len(refused) == len(indices) and not self.running:
                futures[0].result()  # nothing of this rerank runs: the queue is full of others' work
            self.waiting.extendleft(reversed(refused))
            return not self.waiting and not self.running

    def _on_out_done(self, out: Future[list[float]]) -> None:
        """Cancelled or failed: cancel what still runs (the batcher frees their sequences)."""
        if not out.cancelled() and out.exception() is None:
            return
        with self.lock:
            running = [f for futures in self.running.values() for f in futures]
        for future in running:
            future.cancel()


def _score(completion: Completion) -> float:
    probs = completion.label_probs
    if not probs:
        raise RuntimeError("a label request's completion carries no label_probs")
    return float(probs[0])

