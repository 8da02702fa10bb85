"""The ``host_cap`` workload's split legs: the daemon's front end in a process of its own
(``llamactor serve --frontend-processes 1``: ``llamactor.http.frontends``) over the bench's own
replayed tree, so that the *http_fp* and *sse_fp* legs run the same tree as the in-process ones.
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
def split_front_end(router: Any, specs: list[ModelSpec], port: int) -> Iterator[tuple[str, int]]:
    """One front-end process serving ``router``'s models on ``port``; yields its URL and pid."""
    transport = Config(frontend_processes=1)
    setup = FrontendSetup(specs, None, 1 << 20, None, transport, "127.0.0.1", 1.0, None, jobs=False)
    frontends = Frontends(setup, listening_socket("127.0.0.1", port, None), 1)
    frontends.serve(router)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url)
        yield url, frontends.pids()[0]
    finally:
        frontends.stop(30)


def _wait_ready(url: str) -> None:
    """Until ``/health`` answers 200 (the front end has its models); no event crosses to here."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the front-end process at {url} did not become ready")


def process_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used (all its threads); 0 where ``/proc`` has none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
