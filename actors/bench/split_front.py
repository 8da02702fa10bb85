"""The ``host_cap`` workload's split legs: the daemon's front end in processes of its own
(``llamactor serve --frontend-processes N``: ``llamactor.http.frontends``) over the bench's own
replayed tree, so that the *http_fp* and *sse_fp* legs (*http_fpN*, *sse_fpN* for N of them) run
the same tree as the in-process ones.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from llamactor.base.config import Config
from llamactor.http.frontend_main import FrontendSetup
from llamactor.http.frontends import Frontends, listening_socket
from llamactor.serving.model_specs import ModelSpec

READY_TIMEOUT_S = 120.0


@contextlib.contextmanager
def split_front_end(router: Any, specs: list[ModelSpec], port: int, count: int = 1) -> Iterator[tuple[str, list[int]]]:
    """``count`` front-end processes on one socket (``--frontend-processes count``) serving
    ``router``'s models on ``port``; yields its URL and their pids."""
    transport = Config(frontend_processes=count)
    setup = FrontendSetup(specs, None, 1 << 20, None, transport, "127.0.0.1", 1.0, None, jobs=False)
    frontends = Frontends(setup, listening_socket("127.0.0.1", port, None), count)
    frontends.serve(router)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, count)
        yield url, frontends.pids()
    finally:
        frontends.stop(30)


def _wait_ready(url: str, count: int) -> None:
    """Until ``/health`` answers 200 (a front end has its models) on ``2 * count`` new connections
    in a row, whichever front ends take them (no event crosses to here; a front end reads its
    models' READY before it accepts, so one that answers at all is all but surely ready)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    ready = 0
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                ready = ready + 1 if response.status == 200 else 0
                if ready >= 2 * count:
                    return
                continue
        except (urllib.error.URLError, OSError):
            ready = 0
        time.sleep(0.1)
    raise RuntimeError(f"the front-end process at {url} did not become ready")


def processes_cpu_s(pids: list[int]) -> float:
    """CPU seconds the processes ``pids`` have used together."""
    return sum(process_cpu_s(pid) for pid in pids)


def process_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used (all its threads); 0 where ``/proc`` has none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
