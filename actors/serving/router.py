"""``Router``: several models, each with its replicas, behind one handle (docs/architecture.md,
*Several models and replicas*).

    with llamactor.start(models=[{"name": "chat", "replicas": 2, "policy": "prefix_affinity"},
                                 {"name": "small", "path": "/models/other.gguf", "preload": False}]) as router:
        router["chat"].chat([{"role": "user", "content": "Hi"}])

A request names its model; ``router[name]`` (or ``router.model(name)``) is that model's
``Replicas``, which has the whole request API of ``LLM``. Every replica is its own actor tree with
its own supervisor, so a crash in one touches no other. Models load at start (``preload``) or on
first use; at most ``max_loaded`` are loaded at once (the least recently used idle one is unloaded
to make room, as llama.cpp's router mode does), and a model idle for its ``idle_unload_s`` is
unloaded by the router's janitor thread; a ``pin``ned model loads at start and stays. Which model
is loaded, loading or unloaded is ``model_status``'s bookkeeping (``status``, ``describe``).
Methods run on the caller's thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


from llamactor.base.logging import get_logger
from llamactor.base.errors import BatcherUnavailableError, InvalidRequestError
from llamactor.serving.model_specs import ModelSpec, model_named, specs_from
from llamactor.serving.model_status import ModelStatus, Resident, StatusMap, evictions
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
        pinned = [s.name for s in specs if s.pin]
        if max_loaded is not None and len(pinned) > max_loaded:
            raise InvalidRequestError(f"{len(pinned)} pinned models ({', '.join(pinned)}) exceed max_loaded={max_loaded}")
        self.max_loaded = max_loaded
        self._status = StatusMap(s.name for s in specs)
        self._status_lock = threading.Lock()
        # called with a model's name after each change of its status (the loading or unloading thread)
        self.status_listeners: list[Callable[[str], None]] = []
        self._models = {s.name: Replicas(s, before_load=self._make_room, on_status=self._record) for s in specs}
        self._room_lock = threading.Lock()
        self._closed = threading.Event()
        self._janitor: threading.Thread | None = None
        try:  # pinned models first: they must fit; then the others that preload, as max_loaded allows
            preload = sorted((r for r in self._models.values() if r.spec.preload or r.spec.pin),
                             key=lambda r: not r.spec.pin)
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
        return model_named(self._models, name)

    __getitem__ = model

    def __iter__(self) -> Any:
        return iter(self._models.values())

    def _make_room(self, loading: Replicas) -> None:
        """Before ``loading`` loads: unload the least recently used idle models beyond ``max_loaded``
        (``model_status.evictions`` decides; pinned and busy models stay)."""
        if self.max_loaded is None:
            return
        with self._room_lock:
            loaded = [Resident(r.name, r.last_used, r.in_flight, r.spec.pin)
                      for r in self._models.values() if r.loaded and r is not loading]
            names = evictions(loaded, self.max_loaded)
            if names is None:
                raise BatcherUnavailableError(f"cannot load {loading.name!r}: {self.max_loaded} model(s) are loaded "
                                              "(max_loaded) and busy or pinned")
            for name in names:
                log.info("model_evicted", model=name, loading=loading.name, max_loaded=self.max_loaded)
                self._models[name].unload()

    def _record(self, replicas: Replicas, status: str, error: str | None) -> None:
        """A ``Replicas`` changed state (on the thread that loads or unloads it)."""
        with self._status_lock:
            if status == "failed":
                self._status.failed(replicas.name, error or "")
            else:
                getattr(self._status, status)(replicas.name)
        for listener in list(self.status_listeners):
            listener(replicas.name)

    def status(self, name: str) -> ModelStatus:
        """The model's ``ModelStatus`` (loaded, loading, unloaded; the last load's error)."""
        self.model(name)  # ModelNotFoundError for an unknown name
        with self._status_lock:
            return self._status[name]

    def describe(self, name: str) -> dict[str, Any]:
        """What ``GET /models`` says of a model, as llama-server's router mode does: its ``status``
        object, ``path``, ``size`` in bytes (0: not found here), and whether it is ``pinned``."""
        replicas = self.model(name)
        path = replicas.path
        size = os.path.getsize(path) if path else 0
        return {"status": self.status(name).to_dict(), "path": path, "size": size, "pinned": replicas.spec.pin}

    def load(self, name: str) -> None:
        """Load the model now (no-op when loaded); ``ModelLoadError`` naming its file if it cannot be."""
        self.model(name).load()

    def unload(self, name: str, drain_timeout_s: float | None = 0.0) -> None:
        """Unload the model (it loads again on its next request); a pinned one is refused."""
        replicas = self.model(name)
        if replicas.spec.pin:
            raise InvalidRequestError(f"model {name!r} is pinned: it stays loaded")
        replicas.unload(drain_timeout_s)

    def unload_idle(self, now: float | None = None) -> list[str]:
        """Unload every model idle longer than its ``idle_unload_s``; their names."""
        now = time.monotonic() if now is None else now
        unloaded = []
        for replicas in self._models.values():
            limit = replicas.spec.idle_unload_s
            if (limit is not None and replicas.loaded and replicas.in_flight == 0 and not replicas.spec.pin
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
