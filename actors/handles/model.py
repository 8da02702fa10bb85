"""What a front end (the HTTP app, under Ray Serve too) needs of the models it serves.

``ModelClient``: one named model behind the request API, loaded on demand, whose replicas report
stats without waiting (``Replicas`` in-process, ``RemoteReplicas`` under Ray Serve).
``ModelRouter``: the models by name (``Router``, ``RemoteRouter``). Caller threads only.
"""

from __future__ import annotations

from typing import Any, Protocol

from llamactor.base.sampling import SamplingParams
from llamactor.base.engine_info import EngineInfo
from llamactor.base.sampling_defaults import model_sampling
from llamactor.base.errors import ModelNotLoadedError
from llamactor.base.tenants import Tenant
from llamactor.base.tool_format import ToolCallFormat
from llamactor.handles.client import Client


class ModelClient(Client):
    """A named model: the request API plus loading and per-replica stats."""

    name: str

    @property
    def loaded(self) -> bool:
        raise NotImplementedError

    @property
    def info(self) -> EngineInfo:
        """The model's ``EngineInfo`` (context sizes, GGUF metadata); loads the model if needed."""
        raise NotImplementedError

    def tool_format(self) -> ToolCallFormat:
        return self.info.tool_format

    def sampling_defaults(self) -> SamplingParams:
        """The operator's sampling over the GGUF's own (loads the model if needed)."""
        return model_sampling(self.config.sampling, self.info.gguf_sampling)

    def load(self) -> None:
        """Start the model's replicas if they are not running (blocks while they load)."""
        raise NotImplementedError

    def replica_stats(self, *, exact: bool = False) -> list[dict[str, Any]]:
        """One dict per replica (``state``, ``running``, ``pending`` ...). Without ``exact`` it
        never waits for a decode step: what health checks and metrics scrapes call."""
        raise NotImplementedError


class ModelRouter(Protocol):
    """The models a front end serves, by name."""

    @property
    def names(self) -> list[str]: ...

    def model(self, name: str | None = None) -> ModelClient:
        """The model called ``name`` (None: the first); ``ModelNotFoundError`` if none is."""
        ...


def check_may_load(model: ModelClient, tenant: Tenant) -> None:
    """``ModelNotLoadedError`` (503) unless ``tenant`` may load ``model`` by asking for it: admins
    may; tenants only where the model's ``load_on_request`` is "tenants" (loading may evict another
    tenant's model under ``max_loaded``: ``/models/load`` is an admin's)."""
    if not model.loaded and not tenant.admin and model.config.load_on_request != "tenants":
        raise ModelNotLoadedError(f"model {model.name!r} is not loaded, and this server loads models on request only "
                                  "for admins (load_on_request=admins): ask an admin to load it (POST /models/load)")
