"""Which llamactor modules one HTTP chat request passes through on the caller's side (the event
loop and the request's threads), plain and streamed, and how often its tools are compiled; the
actor tree's threads are not traced. Runs the app in-process (FastAPI's TestClient) on the
default model:

    .venv/bin/python examples/request_modules.py

(docs/architecture.md, "One HTTP chat request, module by module", gives its counts.)
"""

from __future__ import annotations

import collections
import json
import sys
import threading
from typing import Any

from fastapi.testclient import TestClient

import llamactor
from llamactor.http.server import create_app
from llamactor.http.state import ServerState

COUNTED = ("grammar", "_checked", "from_openai", "pop_tools")  # the tool grammar, each compile, each parse
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
        "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]}


class Tracer:
    """A profile hook that, while ``recording``, counts the llamactor modules and functions entered."""

    def __init__(self) -> None:
        self.recording = False
        self.modules: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        module = frame.f_globals.get("__name__", "")
        if self.recording and event == "call" and module.startswith("llamactor"):
            self.modules[module] += 1
            if frame.f_code.co_name in COUNTED:
                self.calls[f"{module}.{frame.f_code.co_name}"] += 1


def main() -> None:
    router = llamactor.Router([llamactor.ModelSpec(name="m", config=llamactor.Config(n_parallel=2, n_ctx=2048))])
    state = ServerState(["m"], None, 1 << 20)
    state.router = router
    tracer = Tracer()
    threading.setprofile(tracer)  # the app's threads start below and inherit it
    sys.setprofile(tracer)
    with TestClient(create_app(state), base_url="http://127.0.0.1") as client:
        client.post("/v1/chat/completions", json=BODY)  # warm
        for stream in (False, True):
            tracer.modules.clear()
            tracer.calls.clear()
            tracer.recording = True
            response = client.post("/v1/chat/completions", json={**BODY, "stream": stream})
            tracer.recording = False
            assert response.status_code == 200, response.text
            print(json.dumps({"stream": stream, "n_modules": len(tracer.modules), "calls": tracer.calls,
                              "modules": sorted(tracer.modules)}))
    sys.setprofile(None)
    router.close()


if __name__ == "__main__":
    main()
