"""``llamactor serve``: the HTTP daemon's lifecycle under a process supervisor (systemd, supervisord).

The socket opens at once and ``/health`` answers 503 while the model loads in a background
thread; a model that cannot be loaded ends the process with status 1 and a one-line reason.
SIGTERM and SIGINT drain: uvicorn stops accepting connections and waits up to
``drain_timeout_s`` for in-flight requests (streams included), then the actor tree is closed and
the process exits 0.

The edge is bounded (``Config``'s transport fields; docs/operations.md, *Threat model*, "The
transport"): uvicorn's httptools protocol with a request head capped at ``max_header_bytes`` and a
deadline on each head (``header_timeout_s``: a client trickling its headers cannot hold a
connection; both in ``edge_protocol``), at most ``limit_concurrency`` connections and requests (503
beyond), idle keep-alive connections closed. The event loop is uvloop's (uvicorn's ``loop="auto"``
takes it when it is installed, as it is with llamactor outside Windows), else asyncio's.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

import llamactor
from llamactor.base.config import Config
from llamactor.base.logging import get_logger
from llamactor.base.tenants import Tenant, tenant_named
from llamactor.handles import tracing
from llamactor.serving.model_specs import ModelSpec
from llamactor.http.edge_protocol import edge_protocol
from llamactor.http.keys_file import load_keys, reload_on_sighup
from llamactor.http.server import create_app
from llamactor.http.state import ServerState
from llamactor.jobs.database import StoreLockedError
from llamactor.jobs.journal import JobStore
from llamactor.jobs.service import JobService

log = get_logger("llamactor.daemon")


def model_id_for(path: str) -> str:
    return Path(path).name.removesuffix(".gguf")


def serve(*, host: str, port: int, uds: str | None, api_key: str | None, drain_timeout_s: float,
          max_body_bytes: int, models: list[ModelSpec], max_loaded: int | None = None,
          data_dir: str | None = None, keys_file: str | None = None, transport: Config | None = None) -> int:
    """Run until signalled; return the process exit status. ``data_dir`` holds the batch jobs
    (default: the user's data folder, ``platformdirs.user_data_dir("llamactor")``); ``keys_file``
    the tenants' keys, read again on SIGHUP; ``transport`` the edge's limits and allowed origins."""
    keys = load_keys(keys_file) if keys_file else None  # a wrong file: the caller's one-line reason
    # before the app is made (its tracing middleware) and the socket opens: a missing SDK ends it now
    try:
        tracing.configure(next((m.config.otlp_endpoint for m in models if m.config.otlp_endpoint), None))
    except tracing.TracingUnavailableError as e:
        print(f"llamactor serve: {e}", file=sys.stderr)
        return 1
    transport = transport or Config()
    state = ServerState([m.name for m in models], api_key, max_body_bytes, keys, transport=transport,
                        bind_host=None if uds else host)
    if keys_file:
        reload_on_sighup(state, keys_file, api_key)
    jobs = open_jobs(data_dir)
    attach_jobs(state, jobs)
    app = create_app(state)
    config = uvicorn_config(app, transport, host=host, port=port, uds=uds, drain_timeout_s=drain_timeout_s)
    _raise_file_limit(transport.limit_concurrency)
    server = _DrainingServer(config, state)
    exit_code = 0
    router: llamactor.Router | None = None

    def load() -> None:
        nonlocal exit_code, router
        try:
            router = state.router = llamactor.Router(models, max_loaded=max_loaded)
            if jobs is not None:  # unfinished batch jobs resume once the models are there
                jobs.start(functools.partial(state.model, router))
            server.listening.wait()  # "ready" means a client can connect: the socket is bound by now
            for replicas in router:
                if replicas.loaded:
                    log.info("model_ready", model=replicas.name, replicas=replicas.spec.replicas,
                             n_ctx=replicas.info.n_ctx, n_parallel=replicas.config.n_parallel)
            # every model served, loaded or not (a folder of models may load none until asked)
            log.info("router_ready", models=router.names, loaded=[r.name for r in router if r.loaded])
        except Exception as e:  # noqa: BLE001 - any failure to load ends the daemon with a reason
            print(f"llamactor serve: cannot load the model: {e}", file=sys.stderr)
            exit_code = 1
            server.should_exit = True

    threading.Thread(target=load, name="model-loader", daemon=True).start()
    log.info("serving", address=uds or f"http://{host}:{port}", models=state.model_names, pid=os.getpid())
    server.run()  # returns after SIGTERM/SIGINT and the graceful drain of open connections
    state.draining = True
    if jobs is not None:
        jobs.close()  # jobs stop with what they had in flight pending: they resume on the next start
    if router is not None:
        router.close(drain_timeout_s=drain_timeout_s)
    log.info("stopped", exit_code=exit_code)
    return exit_code


def uvicorn_config(app: Any, transport: Config, *, host: str, port: int, uds: str | None = None,
                   drain_timeout_s: float = 1.0) -> uvicorn.Config:
    """How the daemon runs its app on uvicorn (also what the ``host_cap`` benchmark serves with)."""
    return uvicorn.Config(app, host=host, port=port, uds=uds, log_config=None, access_log=False,
                          timeout_graceful_shutdown=max(1, math.ceil(drain_timeout_s)), lifespan="off",
                          http=edge_protocol(transport.header_timeout_s, transport.max_header_bytes),
                          limit_concurrency=transport.limit_concurrency,
                          timeout_keep_alive=transport.keep_alive_s)  # type: ignore[arg-type]


def attach_jobs(state: ServerState, jobs: JobService | None) -> None:
    """``jobs`` as the app's batch jobs: a job runs as its owner, with the owner's weight and cache
    scope, and its lines spend the owner's requests and tokens per minute."""
    state.jobs = jobs
    if jobs is not None:
        jobs.tenant = lambda name: (tenant_named(name, state.keys.tenants) if state.keys.required
                                    else Tenant(admin=True))  # keyless: as its requests are
        jobs.limiter = state.limiter


def jobs_dir(data_dir: str | None) -> str:
    """The batch jobs' data dir: ``data_dir``, or by default the user's data folder."""
    import platformdirs

    return data_dir or platformdirs.user_data_dir("llamactor")


def open_jobs(data_dir: str | None) -> JobService | None:
    """The batch jobs of ``data_dir``; None (batch routes answer 503) when another process owns it."""
    path = jobs_dir(data_dir)
    try:
        return JobService(JobStore.in_data_dir(path))
    except StoreLockedError as e:
        log.warning("jobs_unavailable", data_dir=path, reason=str(e))
        return None


def _raise_file_limit(connections: int) -> None:
    """Each connection is a file descriptor: raise the soft limit toward what ``connections``
    needs (beside the models', logs' and journal's files), as far as the hard limit allows."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < wanted:
            log.warning("file_limit_low", limit=new, limit_concurrency=connections)


class _DrainingServer(uvicorn.Server):
    """Marks the app as draining the moment a signal arrives, so /health turns 503 at once; says
    when it is listening (the loader logs ``model_ready`` only then: a client may connect)."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self._state = state
        self.listening = threading.Event()  # set once the socket is bound (never, if binding failed)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:  # main thread, uvicorn's loop
        await super().startup(sockets)
        if self.started:
            self.listening.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """As uvicorn's, except that a drain signal is not re-raised afterwards: a supervisor
        that sent SIGTERM must see the clean exit 0 that follows the drain."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self._state.draining:
            log.info("draining", signal=sig)
        self._state.draining = True
        super().handle_exit(sig, frame)
