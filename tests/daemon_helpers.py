"""Start ``llamactor serve`` as a real subprocess on a free loopback port, and stop it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import openai

API_KEY = "sk-test-key"
MODEL_ID = "gemma-3-270m-q4_k_m"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    process: subprocess.Popen[str]
    port: int
    log_lines: list[dict] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    new_line: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, api_key: str = API_KEY, **kw: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **kw)

    def events(self, name: str) -> list[dict]:
        return [line for line in self.log_lines if line.get("event") == name]

    def wait_for_log(self, predicate: Callable[[dict], bool], timeout: float = 30) -> bool:
        """Block until a log line (already seen or still to come) satisfies ``predicate``."""
        with self.new_line:
            return self.new_line.wait_for(lambda: any(predicate(line) for line in self.log_lines), timeout)

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def start_daemon(*args: str, wait_ready: bool = True, timeout: float = 120) -> Daemon:
    port = free_port()
    cmd = [sys.executable, "-m", "llamactor.cli", "serve", "--port", str(port), "--log-format", "json",
           "--log-level", "info", "--n-ctx", "4096", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    daemon = Daemon(proc, port)

    def read_logs() -> None:  # the daemon's JSON log lines tell us when it is ready
        assert proc.stderr is not None
        for raw in proc.stderr:
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                line = {"event": "raw", "text": raw.rstrip()}
            with daemon.new_line:
                daemon.log_lines.append(line)
                daemon.new_line.notify_all()
            if line.get("event") == "model_ready":
                daemon.ready.set()
        daemon.ready.set()  # exited: nobody will say ready

    threading.Thread(target=read_logs, daemon=True).start()
    if wait_ready:
        assert daemon.ready.wait(timeout), "daemon did not become ready"
        assert proc.poll() is None, f"daemon exited: {daemon.log_lines[-5:]}"
    return daemon
