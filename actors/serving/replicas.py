"""``Replicas``: the replicas of one model (one actor tree each) behind the request API.

Each request goes to the replica its ``RoutingPolicy`` ranks first, given how many requests this
handle has in flight on each; it stays there (a replica's supervisor replays its own requests
after a batcher restart, and never hands them to another replica). The ``n`` choices of one
prompt go to one replica together, so its KV is computed once. Methods run on the caller's
thread; ``load``/``unload`` block while trees start or stop.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


from llamactor.base.logging import get_logger
from llamactor.handles.llm import LLM, start_tree
from llamactor.handles.model import ModelClient
from llamactor.base.completion import Completion
from llamactor.base.engine_info import EngineInfo
from llamactor.base.errors import BatcherUnavailableError, ModelLoadError
from llamactor.base.messages import CallerMessage, Embed, Generate
from llamactor.base.models import resolve_model_path
from llamactor.base.sampling import SamplingParams
from llamactor.native.gguf_header import read_gguf
from llamactor.serving.model_specs import ModelSpec
from llamactor.serving.routing import RoutingPolicy, routing_key

log = get_logger("llamactor.serving.replicas")


class Replicas(ModelClient):
    """A model's replica trees; loaded by ``load()`` or on the first request."""

    def __init__(self, spec: ModelSpec, before_load: Callable[[Replicas], None] | None = None,
                 on_status: Callable[[Replicas, str, str | None], None] | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.config = spec.config
        self.policy = RoutingPolicy(spec.policy, spec.imbalance_threshold)
        self._before_load = before_load  # the router makes room under max_loaded
        # the router's status map hears "loading", "loaded", "failed" (with the reason), "unloaded"
        self._on_status = on_status or (lambda replicas, status, error: None)
        self._trees: list[LLM] = []
        self._in_flight = [0] * spec.replicas
        self._where: dict[str, int] = {}  # request id -> replica, for cancel
        self._lock = threading.Lock()  # routing state: in_flight, where, policy
        self._load_lock = threading.Lock()  # one load or unload at a time
        self.last_used = time.monotonic()
        self.served = [0] * spec.replicas  # requests routed to each replica since start

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return bool(self._trees)

    @property
    def info(self) -> EngineInfo:
        """The model's ``EngineInfo`` (loads the model if needed)."""
        self.load()
        return self._trees[0].info

    def sampling_defaults(self) -> SamplingParams:
        """The first replica's: each tree layers the operator's over the GGUF's once, not per request."""
        return self.replica(0).sampling_defaults()

    def replica(self, index: int) -> LLM:
        """Replica ``index``'s own handle (loads the model if needed)."""
        self.load()
        return self._trees[index]

    @property
    def in_flight(self) -> int:
        with self._lock:
            return sum(self._in_flight)

    def load(self) -> None:
        """Start every replica's tree (no-op when loaded); ``ModelLoadError`` if one cannot start."""
        if self._trees:
            return
        with self._load_lock:
            if self._trees:
                return
            if self._before_load is not None:
                self._before_load(self)
            started = time.perf_counter()
            self._on_status(self, "loading", None)
            trees: list[LLM] = []
            try:
                for _ in range(self.spec.replicas):
                    trees.append(start_tree(self.config))
            except BaseException as e:
                for tree in trees:
                    tree.close()
                error = self._load_error(e) if isinstance(e, ModelLoadError) else e
                self._on_status(self, "failed", str(error) or type(e).__name__)
                log.warning("model_load_failed", model=self.name, error=str(error))
                if error is e:
                    raise
                raise error from e
            self._trees = trees
            self.last_used = time.monotonic()
            self._on_status(self, "loaded", None)
            log.info("model_loaded", model=self.name, replicas=len(trees),
                     ms=round((time.perf_counter() - started) * 1000, 1))

    @property
    def path(self) -> str | None:
        """The GGUF file this model loads (None when it cannot be found here)."""
        try:
            return resolve_model_path(self.config.model)
        except ModelLoadError:
            return None

    def _load_error(self, e: ModelLoadError) -> ModelLoadError:
        """``e`` naming the model and its file, and what the file's header says when it is no GGUF.
        A typed refusal (``SequenceLimitError``) is the caller's as raised -- its class, message and
        details, which it may act on -- with only the model and file added to its details."""
        path = self.path or self.config.model
        if type(e) is not ModelLoadError:
            e.details.setdefault("model", self.name)
            e.details.setdefault("path", path)
            return e
        reason = str(e)
        if path and os.path.isfile(path) and read_gguf(path) is None:
            reason += "; its GGUF header cannot be read (not a GGUF file, or truncated)"
        return ModelLoadError(f"model {self.name!r} could not be loaded from {path}: {reason}",
                              model=self.name, path=path)

    def unload(self, drain_timeout_s: float | None = 0.0, *, force: bool = False) -> None:
        """Stop the trees (after letting in-flight requests finish up to ``drain_timeout_s``);
        the next request loads them again. A pinned model stays loaded unless ``force`` (closing)."""
        if self.spec.pin and not force:
            log.info("model_pinned_kept", model=self.name)
            return
        with self._load_lock:
            started = time.perf_counter()
            trees, self._trees = self._trees, []
            for tree in trees:
                tree.close(drain_timeout_s)
            with self._lock:
                for replica in range(self.spec.replicas):
                    self.policy.forget(replica)
            if trees:
                self._on_status(self, "unloaded", None)
                log.info("model_unloaded", model=self.name, ms=round((time.perf_counter() - started) * 1000, 1))

    def close(self, drain_timeout_s: float | None = 0.0) -> None:
        self.unload(drain_timeout_s, force=True)

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routing (caller's thread) -----------------------------------------------------------

    def _choose(self, key: str) -> tuple[int, LLM]:
        self.load()
        trees = self._trees
        if not trees:
            raise BatcherUnavailableError(f"model {self.name!r} was unloaded")
        with self._lock:
            ranked = self.policy.rank(key, dict(enumerate(self._in_flight)))
            replica = int(ranked[0])  # type: ignore[call-overload]
            self.policy.routed(key, replica)
            self.served[replica] += 1
        self.last_used = time.monotonic()
        return replica, trees[replica]

    def _track(self, replica: int, request_id: str, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._in_flight[replica] += 1
            self._where[request_id] = replica

        def release(_: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                self._in_flight[replica] -= 1
                self._where.pop(request_id, None)
            self.last_used = time.monotonic()
        future.add_done_callback(release)

    def send(self, msg: CallerMessage) -> concurrent.futures.Future[Any]:
        key = routing_key(msg.text, msg.messages, msg.token_ids) if isinstance(msg, Generate) else ""
        replica, tree = self._choose(key)
        future = tree.send(msg)  # counted once sent: a refused send leaves nothing in flight
        self._track(replica, msg.request_id, future)
        return future

    def send_n(self, msgs: Sequence[Generate]) -> list[concurrent.futures.Future[Completion]]:
        """All ``n`` choices on one replica: the first computes the prompt, the others attach its KV."""
        first = msgs[0]
        replica, tree = self._choose(routing_key(first.text, first.messages, first.token_ids))
        futures = [tree.send(m) for m in msgs]
        for msg, future in zip(msgs, futures, strict=True):
            self._track(replica, msg.request_id, future)
        return futures

    def cancel(self, request_id: str) -> None:
        with self._lock:
            replica = self._where.get(request_id)
        trees = self._trees
        if replica is not None and replica < len(trees):
            trees[replica].cancel(request_id)

    # -- observing ---------------------------------------------------------------------------

    def replica_stats(self, *, exact: bool = False) -> list[dict[str, Any]]:
        """Each replica's published stats (``LLM.published_stats``: never waits; ``exact``: its
        ``LLM.stats()``) with what routing knows: ``in_flight``, ``served``."""
        trees = self._trees
        with self._lock:
            in_flight, served = list(self._in_flight), list(self.served)
        if not trees:
            return [{"state": "unloaded", "in_flight": 0, "served": served[i]} for i in range(self.spec.replicas)]
        return [{**(tree.stats() if exact else tree.published_stats()), "in_flight": in_flight[i],
                 "served": served[i]} for i, tree in enumerate(trees)]

    def stats(self) -> dict[str, Any]:
        """The model's queue (``running``, ``pending``, ``in_flight``, ``served`` summed over its
        replicas), ``state`` the worst of theirs, and each replica's own exact ``stats()`` in
        ``replicas`` (ratios such as ``kv_usage`` are per replica: a sum would mean nothing)."""
        per_replica = self.replica_stats(exact=True)
        total: dict[str, Any] = {"model": self.name, "replicas": per_replica, "policy": self.policy.name}
        for key in ("running", "pending", "in_flight", "served"):
            total[key] = sum(s.get(key) or 0 for s in per_replica)
        states = [s.get("state") for s in per_replica]
        total["state"] = next((st for st in ("failed", "stopped", "restarting", "starting", "unloaded")
                               if st in states), "ready")
        return total
