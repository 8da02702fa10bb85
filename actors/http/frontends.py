"""The daemon's front-end processes (``--frontend-processes``; docs/operations.md, *Front-end
processes*): each one started with the socket the daemon listens on and one end of a
``socketpair`` whose other end is its ``EngineLink`` here, watched, and started again when it
dies -- with a new link; the tenants' rate limits and stored responses (``EngineState``) are
theirs together, here, and outlive any one of them; the listening socket stays open in this process, so connections wait
in its backlog meanwhile, and the engine, its models and their caches are untouched. Requests the
dead process had in flight are cancelled by its link. A front end that keeps dying (more than
``MAX_RESTARTS`` within ``RESTART_WINDOW_S``) stops the daemon, loudly.

Threads: the daemon's main thread starts, restarts and stops them; one watcher thread per
process waits for its exit; the loader thread hands each link the router once it exists.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from llamactor.base.logging import get_logger
from llamactor.http.engine_link import EngineLink
from llamactor.http.engine_state import EngineState
from llamactor.http.frontend_main import FrontendSetup

log = get_logger("llamactor.daemon")
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
LISTEN_BACKLOG = 2048  # as uvicorn's default: what waits while a front end (re)starts


def listening_socket(host: str, port: int, uds: str | None) -> socket.socket:
    """The daemon's socket, bound and listening in this process (inherited by its front ends)."""
    if uds:
        if os.path.exists(uds):
            os.unlink(uds)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(uds)
        os.chmod(uds, 0o666)  # as uvicorn makes it
        sock.listen(LISTEN_BACKLOG)
    else:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


class FrontendProcess:
    """One front-end process and the engine's link to it."""

    def __init__(self, index: int, setup: FrontendSetup, listen: socket.socket,
                 on_exit: Callable[[FrontendProcess], None], state: EngineState | None = None,
                 calls: dict[str, Callable[..., Any]] | None = None) -> None:
        self.index = index
        ours, theirs = socket.socketpair()
        self.link = EngineLink(ours, f"frontend-{index}", state, calls=calls)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llamactor.http.frontend_main", str(listen.fileno()), str(theirs.fileno())],
            stdin=subprocess.PIPE, pass_fds=(listen.fileno(), theirs.fileno()))
        theirs.close()
        assert self.process.stdin is not None
        with self.process.stdin:
            self.process.stdin.write(pickle.dumps(setup))
        log.info("frontend_started", frontend=index, pid=self.process.pid)
        threading.Thread(target=self._watch, args=(on_exit,), name=f"frontend-{index}-watcher", daemon=True).start()

    def _watch(self, on_exit: Callable[[FrontendProcess], None]) -> None:
        """The watcher thread: waits for the process to exit, then says so."""
        self.process.wait()
        on_exit(self)


class Frontends:
    """The daemon's front ends (main thread, except ``serve``: the loader thread). ``calls``: the
    engine's CALL methods beside the router's, on every link (``EngineLink``)."""

    def __init__(self, setup: FrontendSetup, listen: socket.socket, count: int,
                 calls: dict[str, Callable[..., Any]] | None = None, state: EngineState | None = None) -> None:
        self._setup, self._listen, self._calls = setup, listen, calls
        self._lock = threading.Lock()
        self._router: Any = None
        self._exited: deque[FrontendProcess] = deque()
        self.wake = threading.Event()  # a front end exited (or the daemon's state changed)
        self._restarts: deque[float] = deque()
        self.state = state or EngineState()  # the tenants' limits and stored responses, shared by every front end
        self._procs = [self._start(i) for i in range(count)]

    def _start(self, index: int) -> FrontendProcess:
        proc = FrontendProcess(index, self._setup, self._listen, self._exited_one, self.state, self._calls)
        with self._lock:
            if self._router is not None:
                proc.link.serve(self._router)
        return proc

    def _exited_one(self, proc: FrontendProcess) -> None:  # a watcher thread
        self._exited.append(proc)
        self.wake.set()

    def serve(self, router: Any) -> None:
        """The loader thread: the models are there; every link (and each later one) serves them."""
        with self._lock:
            self._router = router
            for proc in self._procs:
                proc.link.serve(router)

    def restart_exited(self) -> bool:
        """Main thread: start again each front end that exited; False when they keep dying (the
        daemon then stops)."""
        while self._exited:
            dead = self._exited.popleft()
            log.error("frontend_died", frontend=dead.index, pid=dead.process.pid, exit_code=dead.process.returncode)
            now = time.monotonic()
            self._restarts.append(now)
            while self._restarts and now - self._restarts[0] > RESTART_WINDOW_S:
                self._restarts.popleft()
            if len(self._restarts) > MAX_RESTARTS:
                log.error("frontend_failing", restarts=len(self._restarts), window_s=RESTART_WINDOW_S)
                return False
            dead.link.closed.wait(5)  # its requests cancelled before the new one takes connections
            self._procs[dead.index] = self._start(dead.index)
        return True

    def pids(self) -> list[int]:
        return [proc.process.pid for proc in self._procs]

    def signal(self, sig: int) -> None:
        for proc in self._procs:
            if proc.process.poll() is None:
                proc.process.send_signal(sig)

    def stop(self, timeout_s: float) -> None:
        """Main thread: SIGTERM each (they drain their connections), then wait; kill what lingers."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self._procs:
            try:
                proc.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("frontend_killed", frontend=proc.index, pid=proc.process.pid)
                proc.process.kill()
                proc.process.wait()
        self._listen.close()
