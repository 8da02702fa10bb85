"""``llamactor serve --frontend-processes N``: the daemon with its HTTP front end in processes of
its own (``frontends``) and the engine -- the models' trees, supervisors, scheduler -- in this one
(docs/operations.md, *Front-end processes*).

As the one-process daemon (``daemon.serve``): the socket opens at once and ``/health`` answers
503 until the models are loaded (a model that cannot be loaded ends the daemon with status 1 and
a one-line reason); SIGTERM and SIGINT drain -- each front end stops accepting and finishes its
requests within ``drain_timeout_s``, then the models are closed and the daemon exits 0; SIGHUP is
passed on (the front ends read the keys file again, as this process does for the batch jobs,
which run here: ``engine_jobs``). A front end that dies is started again.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import llamactor
from llamactor.base.config import Config
from llamactor.base.logging import get_logger
from llamactor.handles import tracing
from llamactor.http.engine_jobs import EngineJobs
from llamactor.http.engine_state import EngineState
from llamactor.http.frontend_main import FrontendSetup
from llamactor.http.frontends import Frontends, listening_socket
from llamactor.serving.model_specs import ModelSpec

log = get_logger("llamactor.daemon")


def serve_split(*, host: str, port: int, uds: str | None, api_key: str | None, drain_timeout_s: float,
                max_body_bytes: int, models: list[ModelSpec], max_loaded: int | None = None,
                data_dir: str | None = None, keys_file: str | None = None, transport: Config | None = None) -> int:
    """Run until signalled; the exit status (the arguments are ``daemon.serve``'s)."""
    transport = transport or Config(frontend_processes=1)
    otlp_endpoint = next((m.config.otlp_endpoint for m in models if m.config.otlp_endpoint), None)
    try:  # spans are recorded where requests are submitted (the front end): a missing SDK ends it now
        tracing.configure(otlp_endpoint)
    except tracing.TracingUnavailableError as e:
        print(f"llamactor serve: {e}", file=sys.stderr)
        return 1
    shared = EngineState()  # the front ends' tenants' limits and stored responses; the jobs' limits too
    jobs = EngineJobs(FrontendSetup(models, api_key, max_body_bytes, keys_file, transport, None if uds else host,
                                    drain_timeout_s, data_dir, otlp_endpoint=otlp_endpoint), shared.limiter)
    frontends = Frontends(jobs.frontend_setup(), listening_socket(host, port, uds), transport.frontend_processes,
                          jobs.calls(), shared)
    stopping = threading.Event()
    exit_code = 0
    router: llamactor.Router | None = None

    def load() -> None:
        nonlocal exit_code, router
        try:
            router = llamactor.Router(models, max_loaded=max_loaded)
            frontends.serve(router)
            jobs.start(router)  # unfinished batch jobs resume once the models are there
            log.info("router_ready", models=router.names, loaded=[r.name for r in router if r.loaded],
                     frontend_processes=transport.frontend_processes)
        except Exception as e:  # noqa: BLE001 - any failure to load ends the daemon with a reason
            print(f"llamactor serve: cannot load the model: {e}", file=sys.stderr)
            exit_code = 1
            stopping.set()
            frontends.wake.set()

    def on_signal(sig: int, _frame: Any) -> None:
        if sig == signal.SIGHUP:
            frontends.signal(signal.SIGHUP)
            jobs.reload_keys()
            return
        if not stopping.is_set():
            log.info("draining", signal=sig)
        stopping.set()
        frontends.wake.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    threading.Thread(target=load, name="model-loader", daemon=True).start()
    log.info("serving", address=uds or f"http://{host}:{port}", models=[m.name for m in models], pid=os.getpid(),
             frontend_processes=transport.frontend_processes)
    while not stopping.is_set():
        frontends.wake.wait()
        frontends.wake.clear()
        if not stopping.is_set() and not frontends.restart_exited():
            exit_code = 1
            break
    frontends.stop(drain_timeout_s + 5)  # the front ends drain their own connections first
    jobs.close()  # jobs stop with what they had in flight pending: they resume on the next start
    if router is not None:
        router.close(drain_timeout_s=drain_timeout_s)
    log.info("stopped", exit_code=exit_code)
    return exit_code
