"""An ASGI middleware that reads a request body whole before routing, bounded in size (413) and in
time (408), and replays it to the app; and ``refuse``, how every refusal before the body is read
is sent.

It reads the body itself, up to the limit — whether or not the client sent Content-Length, so a
chunked upload cannot grow without bound — within ``body_timeout_s`` of its start, so a client
that stalls or trickles cannot hold a connection and a task. Later ``receive`` calls go to the
server as usual, so the app still learns of a client disconnect. It runs after the key is
checked (``middleware.KeyGuard``): an unauthenticated caller's body is never read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import Response

from llamactor.dialects.errors import ErrorInfo
from llamactor.http.errors import error_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def refuse(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    """Send ``response`` and close the connection (uvicorn closes it after a response that says
    ``Connection: close``): a body the client may still be sending is never read, and a refused
    caller keeps no connection."""
    response.headers["connection"] = "close"
    await response(scope, receive, send)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float = 60.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await refuse(self._too_large(scope), scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.body_timeout_s):
                chunks = await self._read(scope, receive)
        except TimeoutError:
            error = ErrorInfo(408, f"the request body was not received within {self.body_timeout_s:g} s",
                              "invalid_request_error", "request_timeout")
            await refuse(error_response(scope["path"], error), scope, receive, send)
            return
        if chunks is None:  # the client went away
            return
        if isinstance(chunks, Response):
            await refuse(chunks, scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> list[bytes] | Response | None:
        """The body's chunks; a 413 once they pass the limit; None if the client disconnected."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return self._too_large(scope)
            if not message.get("more_body", False):
                return chunks

    def _too_large(self, scope: Scope) -> Response:
        """A 413 in the dialect of the request's path."""
        return error_response(scope["path"], ErrorInfo(413, f"request body over {self.max_body_bytes} bytes",
                                                       "invalid_request_error", "body_too_large"))
