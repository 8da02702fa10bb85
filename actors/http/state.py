"""``ServerState``: what the HTTP app knows: the router once built, the model names, the keys and
their tenants, the transport's limits and origin policy, the drain flag, the metrics, the stored responses, the batch jobs. Read and written on uvicorn's
event loop (the router is set once by the daemon's loader thread). Handlers take it as a
dependency (``State``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from llamactor.base.config import Config
from llamactor.base.tenants import KeyTable, Tenant
from llamactor.handles.limits import Limiter, RateLimiter
from llamactor.handles.model import ModelClient, ModelRouter
from llamactor.http.link_jobs import LinkJobs
from llamactor.http.metrics import Metrics
from llamactor.http.origins import OriginPolicy
from llamactor.http.responses_store import LocalResponses, Responses
from llamactor.jobs.service import JobService

Jobs = JobService | LinkJobs  # what the batch and files routes call


class ServerState:
    """``router`` is a ``llamactor.Router`` (under Ray Serve, ``llamactor.rayserve``'s
    ``RemoteRouter``): ``model(name)`` gives a ``ModelClient``."""

    def __init__(self, model_names: list[str], api_key: str | None, max_body_bytes: int,
                 keys: KeyTable | None = None, *, transport: Config | None = None,
                 bind_host: str | None = "127.0.0.1") -> None:
        """``keys``: the tenants' keys (``--keys``); ``api_key`` (``--api-key``) joins them as
        the default tenant, an admin. Neither: no key is asked for, everyone is the default tenant.
        ``transport``: a ``Config`` whose transport fields (time and size limits, allowed hosts and
        origins) the app applies; ``bind_host``: the address listened on (None: a Unix socket)."""
        self.router: ModelRouter | None = None
        self.model_names = list(model_names)
        self.tenant_keys = keys is not None  # a keys file: tenants, and /metrics for admins only
        self.keys = with_api_key(keys or KeyTable(), api_key)
        self.max_body_bytes = max_body_bytes
        self.transport = transport or Config()
        self.origins = OriginPolicy(self.transport.allowed_hosts, self.transport.allowed_origins, bind_host)
        self.draining = False
        # batch jobs (files, batches): set by the daemon when it owns a data dir (a front-end
        # process: the engine's, over the link)
        self.jobs: Jobs | None = None
        self.metrics = Metrics(self.replica_stats)
        self.responses: Responses = LocalResponses()  # the Responses API's previous_response_id
        self.limiter: RateLimiter = Limiter()  # the tenants' requests and tokens per minute (their keys say how many)

    def model(self, router: ModelRouter, name: str | None) -> ModelClient:
        """The model a request names. As llama-server does, a daemon serving exactly one model
        answers to any name (scripts hard-code ``gpt-3.5-turbo``; responses name the real one);
        Ollama clients' ``name:latest`` finds ``name``. With several models an unknown name is
        ``ModelNotFoundError`` (404)."""
        if name is None or name in self.model_names:
            return router.model(name)
        base, _, tag = name.rpartition(":")
        if base and tag == "latest" and base in self.model_names:
            return router.model(base)
        if (parent := self.adapter_parent(router, name)) is not None:
            return router.model(parent)  # vLLM's convention: a LoRA adapter's name as the model
        if len(self.model_names) == 1:
            return router.model(None)
        return router.model(name)  # raises ModelNotFoundError, naming the models served

    def adapter_parent(self, router: ModelRouter, name: str) -> str | None:
        """The model that has a LoRA adapter called ``name`` (``Config.loras``), if one has."""
        return next((m for m in self.model_names if name in router.model(m).config.lora_names), None)

    def replica_stats(self) -> list[tuple[str, int, dict[str, Any]]]:
        """(model, replica, stats) of every replica of every model, as last published (in-process
        this never waits for an actor; under Ray Serve it asks the replicas)."""
        router = self.router
        if router is None:
            return []
        return [(name, i, s) for name in self.model_names for i, s in enumerate(router.model(name).replica_stats())]


def with_api_key(keys: KeyTable, api_key: str | None) -> KeyTable:
    """``keys`` and, if given, ``--api-key`` as the default tenant's key (an admin)."""
    return KeyTable(keys.entries + KeyTable.single(api_key).entries) if api_key else keys


def tenant_of(request: Request) -> Tenant:
    """Who made the request (the middleware found it from the key)."""
    return request.state.tenant  # type: ignore[no-any-return]


def model_status(replica_states: set[str]) -> str:
    """A model's health from its replicas': ``degraded`` while some restart and others serve."""
    if replica_states <= {"unloaded"}:
        return "unloaded"
    if replica_states == {"ready"}:
        return "ready"
    return "degraded" if "ready" in replica_states else sorted(replica_states - {"unloaded"})[0]


async def server_state(request: Request) -> ServerState:
    """The app's state (event loop). ``async``: FastAPI runs a plain function dependency on a worker
    thread, a hop to another thread and back on every request (docs/performance.md, *A streamed
    token's cost in the front end*)."""
    return request.app.state.server  # type: ignore[no-any-return]


State = Annotated[ServerState, Depends(server_state)]
