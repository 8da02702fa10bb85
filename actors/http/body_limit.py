"""An ASGI middleware that refuses request bodies over a size limit with a 413, before routing.

It reads the body itself, up to the limit — whether or not the client sent Content-Length, so a
chunked upload cannot grow without bound — and replays it to the app. Later ``receive`` calls
go to the server as usual, so the app still learns of a client disconnect.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from llamactor.base.logging import get_logger

log = get_logger("llamactor.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(scope, send, start)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                await self._refuse(scope, send, start)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send, start: float) -> None:
        body = json.dumps({"error": {"message": f"request body over {self.max_body_bytes} bytes",
                                     "type": "invalid_request_error", "param": None, "code": "body_too_large"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        log.info("http_request", method=scope["method"], path=scope["path"], status=413,
                 ms=round((time.perf_counter() - start) * 1000, 1))
