"""The ``sim_device`` workload's HTTP leg: a simulated-device tree served by the daemon's own app
(docs/performance.md, *Simulated device (overlapped steps)*).

``simulated_daemon`` serves one tree on ``simulated_device.SimulatedEngine`` with the daemon's app
and uvicorn settings (``http.daemon.uvicorn_config``) on a thread of this process, as
``llamactor serve`` runs it and as the ``host_cap`` workload serves its replayed tree: the
batcher shares this process's GIL with the event loop that builds and frames every SSE event,
which is what the leg is there to measure. ``sse_burst`` sends N streamed chat completions at once
from ``http_load``, the ``host_cap`` workload's raw-socket client, in a process of its own (so the
client never takes the server's GIL), and reads the device's busy share of the steps they took.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import uvicorn

from llamactor.base.config import Config
from llamactor.bench.host_cap import http_client
from llamactor.bench.http_load import MODEL_ID
from llamactor.bench.replay import Recording
from llamactor.bench.simulated_device import SimulatedDevice, device_figures, start_simulated_tree
from llamactor.handles.llm import LLM
from llamactor.http.daemon import uvicorn_config
from llamactor.http.server import create_app
from llamactor.http.state import ServerState
from llamactor.serving import replicas as replicas_module
from llamactor.serving.router import Router


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def simulated_daemon(model_path: str, config: Config, recording: Recording,
                     device: SimulatedDevice) -> Iterator[tuple[LLM, str]]:
    """The daemon's app on uvicorn (a thread of this process) over one tree on ``device``; yields
    the tree's handle (for the in-process bursts on the same tree) and the server's URL."""
    def start_tree(_config: Config) -> LLM:  # the router's spec names the model; ``config`` is the tree's
        return start_simulated_tree(config, recording, device)

    with mock.patch.object(replicas_module, "start_tree", start_tree):
        router = Router([{"name": MODEL_ID, "path": model_path}])
        router.load(MODEL_ID)
    state = ServerState([MODEL_ID], api_key=None, max_body_bytes=1 << 20)
    state.router = router
    port = _free_port()
    server = uvicorn.Server(uvicorn_config(create_app(state), state.transport, host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, name="sim-device-uvicorn", daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            time.sleep(0.05)  # uvicorn has no started event to wait on
        if not server.started:
            raise RuntimeError("the simulated device's daemon did not start")
        yield router.model(MODEL_ID).replica(0), f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        router.close()


def sse_burst(llm: LLM, url: str, device: SimulatedDevice, n: int, max_tokens: int) -> dict[str, Any]:
    """N streamed chat completions at once over HTTP: the device's busy share of the steps they
    took (``simulated_device.device_figures``), and their token rate as the client saw it."""
    since, before = len(device.steps), llm.stats()
    figures = http_client(url, n, max_tokens, stream=True)
    return {**device_figures(llm, device, since, before),
            "tokens_per_s": figures["tokens"] / figures["seconds"] if figures["seconds"] > 0 else 0.0}
