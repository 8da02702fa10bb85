"""A front-end process (``llamactor serve --frontend-processes N``; docs/operations.md, *Front-end
processes*): the daemon's HTTP app on uvicorn, in a process of its own beside the engine's, as
vLLM's API server beside its engine core. Started by the daemon (``frontends``) as
``python -m llamactor.http.frontend_main LISTEN_FD LINK_FD``, its ``FrontendSetup`` pickled on
stdin: it serves the socket the daemon listens on, and reaches the models over the link.

What the app keeps in its own process is what one process sees of the HTTP traffic: the edge's
checks, the tenants' keys (read again on SIGHUP, which the daemon passes on), the metrics' request
counters. The tenants' requests and tokens per minute and the stored responses are the engine's,
shared by every front end (``link_state``); so are the batch jobs (``link_jobs``: the routes reach
them over the link, their files in the data dir). SIGTERM drains it as it drains the daemon; the
link's end (the engine's process gone) ends it.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import sys
from dataclasses import dataclass

from llamactor.base.config import Config
from llamactor.base.logging import configure_from_env, get_logger
from llamactor.handles import tracing
from llamactor.http.daemon import _DrainingServer, _raise_file_limit, uvicorn_config
from llamactor.http.engine_link import ModelView
from llamactor.http.keys_file import load_keys, reload_on_sighup
from llamactor.http.link_client import EngineConnection, LinkRouter
from llamactor.http.link_state import use_engine_state
from llamactor.http.link_jobs import LinkJobs
from llamactor.http.server import create_app
from llamactor.http.state import ServerState
from llamactor.jobs.journal import JobStore
from llamactor.serving.model_specs import ModelSpec

log = get_logger("llamactor.daemon")


@dataclass(frozen=True)
class FrontendSetup:
    """What a front-end process needs to serve as the daemon would (the daemon's ``serve`` arguments)."""

    specs: list[ModelSpec]
    api_key: str | None
    max_body_bytes: int
    keys_file: str | None
    transport: Config
    bind_host: str | None  # None: a Unix socket
    drain_timeout_s: float
    data_dir: str | None  # the engine's, resolved: its files folder is read and written here too
    jobs: bool = True  # whether the engine's process runs the batch jobs (it owns the data dir)
    otlp_endpoint: str | None = None


def front_state(setup: FrontendSetup) -> ServerState:
    """The app's state as the daemon makes it, without a router yet (``/health``: loading)."""
    keys = load_keys(setup.keys_file) if setup.keys_file else None
    state = ServerState([s.name for s in setup.specs], setup.api_key, setup.max_body_bytes, keys,
                        transport=setup.transport, bind_host=setup.bind_host)
    if setup.keys_file:
        reload_on_sighup(state, setup.keys_file, setup.api_key)
    return state


def run(setup: FrontendSetup, listen_fd: int, link_fd: int) -> int:
    """Serve until SIGTERM (drained) or the engine's end of the link closes; the exit status."""
    tracing.configure(setup.otlp_endpoint)
    state = front_state(setup)
    config = uvicorn_config(create_app(state), setup.transport, host="", port=0,
                            drain_timeout_s=setup.drain_timeout_s)
    _raise_file_limit(setup.transport.limit_concurrency)
    server = _DrainingServer(config, state)
    lost = False

    def ready(_views: list[ModelView]) -> None:  # uvicorn's event loop (where the link is read), once
        state.router = router
        log.info("frontend_ready", models=router.names, pid=os.getpid())

    def gone() -> None:  # uvicorn's event loop: the engine closed the link
        nonlocal lost
        lost = not state.draining
        server.should_exit = True

    link = EngineConnection(socket.socket(fileno=link_fd), ready, gone)
    router = LinkRouter(setup.specs, link)
    use_engine_state(state, link)  # the tenants' limits and the stored responses: the engine's, shared
    if setup.jobs and setup.data_dir is not None:
        state.jobs = LinkJobs(link.call, JobStore.files_dir_of(setup.data_dir))

    async def serve() -> None:  # the link is read on uvicorn's own loop
        link.read_on_loop(asyncio.get_running_loop())
        await server.serve(sockets=[socket.socket(fileno=listen_fd)])  # its family read from it: TCP_NODELAY

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(serve())
    state.draining = True
    if lost:
        log.error("frontend_engine_lost")
    return 1 if lost else 0


def main() -> None:
    configure_from_env()  # this process is ours: its entry point
    setup: FrontendSetup = pickle.load(sys.stdin.buffer)
    sys.exit(run(setup, int(sys.argv[1]), int(sys.argv[2])))


if __name__ == "__main__":
    main()
