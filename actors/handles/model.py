"""What a front end (the HTTP app, under Ray Serve too) needs of the models it serves.

``ModelClient``: one named model behind the request API, loaded on demand, whose replicas report
stats without waiting (``Replicas`` in-process, ``RemoteReplicas`` under Ray Serve).
``ModelRouter``: the models by name (``Router``, ``RemoteRouter``). Caller threads only.
"""

from __future__ import annotations

from typing import Any, Protocol

from llamactor.base.engine_info import EngineInfo
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
