"""``Router``: several models, each with its replicas, behind one handle (seeds 000 and 003).

    with llamactor.start(models=[{"name": "chat", "replicas": 2, "policy": "prefix_affinity"},
                                 {"name": "small", "path": "/models/other.gguf", "preload": False}]) as router:
        router["chat"].chat([{"role": "user", "content": "Hi"}])

A request names its model; ``router[name]`` (or ``router.model(name)``) is that model's
``Replicas``, which has the whole request API of ``LLM``. Every replica is its own actor tree with
its own supervisor, so a crash in one touches no other. Models load at start (``preload``) or on
first use; at most ``max_loaded`` are loaded at once (the least recently used idle one is unloaded
to make room, as llama.cpp's router mode does), and a model idle for its ``idle_unload_s`` is
unloaded by the router's janitor thread. Methods run on the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any


from llamactor.base.logging import get_logger
from llamactor.base.errors import BatcherUnavailableError, InvalidRequestError, ModelNotFoundError
from llamactor.serving.model_specs import ModelSpec, specs_from
from llamactor.serving.replicas import Replicas

log = get_logger("llamactor.serving.router")
JANITOR_PERIOD_S = 1.0


class Router:
    """Named models and their replicas. Use as a context manager, or call ``close()``."""

    def __init__(self, models: Sequence[ModelSpec | Mapping[str, Any]], *, max_loaded: int | None = None,
                 defaults: Mapping[str, Any] | None = None) -> None:
        specs = specs_from(models, defaults)
        if max_loaded is not None and max_loaded < 1:
            raise InvalidRequestError(f"max_loaded must be >= 1, got {max_loaded}")
        self.max_loaded = max_loaded
        self._models = {s.name: Replicas(s, before_load=self._make_room) for s in specs}
        self._room_lock = threading.Lock()
        self._closed = threading.Event()
        self._janitor: threading.Thread | None = None
        try:
            preload = [r for r in self._models.values() if r.spec.preload]
            for replicas in preload[:max_loaded]:
                replicas.load()
        except BaseException:
            self.close()
            raise
        if any(s.idle_unload_s is not None for s in specs):
            self._janitor = threading.Thread(target=self._unload_idle_forever, name="llamactor-router-janitor",
                                             daemon=True)
            self._janitor.start()

    # -- models ------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """The models' names, the default (first) one first."""
        return list(self._models)

    @property
    def default(self) -> Replicas:
        return next(iter(self._models.values()))

    def model(self, name: str | None = None) -> Replicas:
        """The model called ``name`` (None: the first); ``ModelNotFoundError`` if there is none."""
        if name is None:
            return self.default
        try:
            return self._models[name]
        except KeyError:
            raise ModelNotFoundError.among(name, self.names) from None

    __getitem__ = model

    def __iter__(self) -> Any:
        return iter(self._models.values())

    def _make_room(self, loading: Replicas) -> None:
        """Before ``loading`` loads: unload the least recently used idle models beyond ``max_loaded``."""
        if self.max_loaded is None:
            return
        with self._room_lock:
            loaded = [r for r in self._models.values() if r.loaded and r is not loading]
            while len(loaded) >= self.max_loaded:
                idle = sorted((r for r in loaded if r.in_flight == 0), key=lambda r: r.last_used)
                if not idle:
                    raise BatcherUnavailableError(
                        f"cannot load {loading.name!r}: {self.max_loaded} model(s) are loaded (max_loaded) and busy")
                log.info("model_evicted", model=idle[0].name, loading=loading.name, max_loaded=self.max_loaded)
                idle[0].unload()
                loaded.remove(idle[0])

    def unload_idle(self, now: float | None = None) -> list[str]:
        """Unload every model idle longer than its ``idle_unload_s``; their names."""
        now = time.monotonic() if now is None else now
        unloaded = []
        for replicas in self._models.values():
            limit = replicas.spec.idle_unload_s
            if (limit is not None and replicas.loaded and replicas.in_flight == 0
                    and now - replicas.last_used >= limit):
                replicas.unload()
                unloaded.append(replicas.name)
        return unloaded

    def _unload_idle_forever(self) -> None:
        """Runs on the janitor thread until ``close()``."""
        while not self._closed.wait(JANITOR_PERIOD_S):
            for name in self.unload_idle():
                log.info("model_idle_unloaded", model=name)

    # -- observing and closing ---------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each model's ``Replicas.stats()`` by name."""
        return {name: replicas.stats() for name, replicas in self._models.items()}

    def close(self, drain_timeout_s: float | None = 0.0) -> None:
        self._closed.set()
        for replicas in self._models.values():
            replicas.close(drain_timeout_s)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
