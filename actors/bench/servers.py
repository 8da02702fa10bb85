"""Benchmark servers as child processes: start one on a free loopback port, wait for it, measure it.

Used by the legs that go over HTTP (``daemon``, ``peer``): ``running_server`` starts any server
command (``llamactor serve`` through ``serve_command``, or a llama-server) and stops it after;
``idle_cpu_percent`` is the CPU a server process burns with nothing to do.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx


@contextlib.contextmanager
def running_server(command: Callable[[int], list[str]], timeout_s: float = 120) -> Iterator[tuple[str, int]]:
    """Start ``command(port)`` on a free loopback port; once ``/health`` answers 200, yield its URL and pid."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while not _healthy(url):  # a benchmark, not a test: polling the health check is what a client does
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the benchmark server {command(port)[0]} did not become ready")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(60)


def serve_command(model_path: str, model_name: str, *options: str) -> Callable[[int], list[str]]:
    """``llamactor serve`` of ``model_path`` under ``model_name``, for ``running_server``."""
    return lambda port: [sys.executable, "-m", "llamactor.cli", "serve", "--port", str(port), "--model", model_path,
                         "--model-name", model_name, "--log-level", "warning", *options]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def idle_cpu_percent(pid: int, seconds: float = 2.0) -> float:
    """CPU used by process ``pid`` (all its threads) over ``seconds`` with no request in flight."""
    def cpu_seconds() -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    before, t0 = cpu_seconds(), time.perf_counter()
    time.sleep(seconds)  # measuring idleness: nothing to wait for
    return 100 * (cpu_seconds() - before) / (time.perf_counter() - t0)
