"""``EngineJobs``: a split daemon's batch jobs, in the engine's process (``split_daemon``;
docs/architecture.md, *Batch jobs behind front-end processes*). It owns the data dir (its lock),
the journal and the one runner, whose lines go to the models in-process as the one-process
daemon's do; every front end reaches it over its link (``link_jobs``).

What the jobs need of the daemon's state lives here too, in a ``ServerState`` of this process's
own (no app serves it): the tenants' keys -- a job runs as its owner, with the owner's quotas,
weight and cache scope, read again on SIGHUP -- and the model a body names (one model answers
to any name, as the routes resolve it).

Threads: the daemon's main thread makes, reloads and closes it; the loader thread starts it; the
links' call workers call the service.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from llamactor.handles.limits import Limiter
from llamactor.http.daemon import attach_jobs, jobs_dir, open_jobs
from llamactor.http.frontend_main import FrontendSetup
from llamactor.http.keys_file import load_keys, reload_keys
from llamactor.http.link_jobs import JOBS, job_calls
from llamactor.http.state import ServerState


class EngineJobs:
    """The jobs of ``setup.data_dir`` (none, and the batch routes answer 503, when another process
    owns it); ``setup``: what the front ends are started with; ``limiter``: the tenants' one budget,
    the one every front end's requests spend (``EngineState.limiter``), so that a tenant's batch and
    interactive work are counted together."""

    def __init__(self, setup: FrontendSetup, limiter: Limiter) -> None:
        self._setup = setup
        keys = load_keys(setup.keys_file) if setup.keys_file else None
        self.state = ServerState([s.name for s in setup.specs], setup.api_key, setup.max_body_bytes, keys,
                                 transport=setup.transport, bind_host=setup.bind_host)
        self.state.limiter = limiter  # before attach_jobs, which gives it to the service
        self.data_dir = jobs_dir(setup.data_dir)
        self.service = open_jobs(self.data_dir)
        attach_jobs(self.state, self.service)

    def frontend_setup(self) -> FrontendSetup:
        """The front ends' setup: the data dir as resolved here, and whether the jobs are on."""
        return dataclasses.replace(self._setup, data_dir=self.data_dir, jobs=self.service is not None)

    def calls(self) -> dict[str, Callable[..., Any]]:
        """The links' ``jobs`` CALL (``EngineLink``'s ``calls``)."""
        return {} if self.service is None else {JOBS: job_calls(self.service)}

    def start(self, router: Any) -> None:
        """The loader thread: the models are there; unfinished jobs resume."""
        self.state.router = router
        if self.service is not None:
            self.service.start(functools.partial(self.state.model, router))

    def reload_keys(self) -> None:
        """Main thread (SIGHUP): the keys file read again (``engine_keys_reloaded``)."""
        if self._setup.keys_file:
            reload_keys(self.state, self._setup.keys_file, self._setup.api_key, event="engine_keys_reloaded")

    def close(self) -> None:
        """Main thread, once the front ends are gone: the workers stop, their jobs stay resumable."""
        if self.service is not None:
            self.service.close()
