"""The daemon's HTTP/1.1 protocol (uvicorn's event loop): uvicorn's httptools protocol (llhttp, in
C) with the two defences of a request head that uvicorn lacks (docs/operations.md, *Threat model*,
"The transport").

- **A deadline on each head**: a connection that has not sent a whole request line and headers
  ``header_timeout_s`` after it opened (or after its last response) is closed. uvicorn has none:
  its keep-alive timer stops at the first byte, so a client trickling its headers could hold a
  connection for ever.
- **A bound on an incomplete head**: llhttp takes a head of any size, so the bytes read since a
  head began are counted, and a head still incomplete past ``max_header_bytes`` is answered 400
  and its connection closed (what h11's ``max_incomplete_event_size`` did). A complete head over
  the limit reaches the app, whose ``middleware.RequestLog`` answers 431.

- **HTTP/1.0 answers without chunks**: uvicorn's httptools protocol chunks a response without
  Content-Length whatever the request's version, which an HTTP/1.0 client cannot read (RFC 9112
  §6.1: never to 1.0); as h11 did, such a response is delimited by closing the connection.

Why httptools rather than uvicorn's pure-Python h11: a streamed token is one body write per stream,
and h11's event machinery per write cost the loop about as much as everything else of a chunk
(docs/performance.md, *Host cap (front end)*).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from llamactor.http.body_limit import Message

from llamactor.base.logging import get_logger

log = get_logger("llamactor.daemon")
INVALID_REQUEST = "Invalid HTTP request received."  # uvicorn's own 400 text for a head it cannot parse


def edge_protocol(header_timeout_s: float, max_header_bytes: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline on each request head and a bound on an
    incomplete one (see the module's docstring)."""

    class EdgeHttpTools(BoundedHead):
        timeout_s = header_timeout_s
        max_bytes = max_header_bytes

    return EdgeHttpTools


class BoundedHead(HttpToolsProtocol):
    """The protocol; ``edge_protocol`` sets its limits on a subclass. Every method runs on the
    event loop (uvicorn makes one instance per connection)."""

    timeout_s: float = 10.0
    max_bytes: int = 16384

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.heads_complete = 0  # request heads received whole on this connection
        self.head_bytes: int | None = None  # bytes of the open head read so far; None: no head open
        self.read_before_head = 0  # bytes of the current read that belonged to earlier messages
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.read_before_head = 0
        open_before = self.head_bytes is not None
        super().data_received(data)  # the parser's callbacks below run in here
        if self.head_bytes is None or self.transport.is_closing():
            return
        # a head open before this read: all of it is the head's; one begun in it: what came after
        # the earlier messages' bodies and heads (a pipelining client's)
        self.head_bytes += len(data) if open_before else len(data) - self.read_before_head
        if self.head_bytes > self.max_bytes:
            log.info("http_head_too_large", client=str(self.client), bytes=self.head_bytes)
            self.send_400_response(INVALID_REQUEST)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_bytes = 0

    def on_body(self, body: bytes) -> None:
        self.read_before_head += len(body)
        super().on_body(body)

    def on_headers_complete(self) -> None:
        if self.head_bytes is not None:  # about its size: chunk-size lines and spacing aside
            self.read_before_head += 16 + len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
        self.head_bytes = None
        self.heads_complete += 1
        super().on_headers_complete()
        if self.scope["http_version"] == "1.0" and self.cycle is not None and self.cycle.scope is self.scope:
            self.cycle.send = CloseDelimited(self.cycle)  # type: ignore[method-assign, assignment]

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle.response_complete:  # else a pipelined request's head is already here
            self._arm_deadline()

    def _arm_deadline(self) -> None:
        """Close the connection unless another head is whole within ``timeout_s``."""
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.loop.call_later(self.timeout_s, self._head_overdue, self.heads_complete)

    def _head_overdue(self, heads_then: int) -> None:
        if self.heads_complete == heads_then and not self.transport.is_closing():
            log.info("http_head_timeout", client=str(self.client))
            self.transport.close()


class CloseDelimited:
    """An HTTP/1.0 request's ``send`` (uvicorn's event loop): a response without Content-Length
    (a stream) goes out as its bytes, ended by closing the connection, where uvicorn would chunk it."""

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self.cycle, self.send = cycle, cycle.send
        self.delimited = False  # by the close

    async def __call__(self, message: Message) -> None:
        cycle = self.cycle
        if message["type"] == "http.response.start" and not cycle.response_started:
            self.delimited = cycle.scope["method"] != "HEAD" and not any(
                name.lower() == b"content-length" for name, _ in message.get("headers", []))
            if self.delimited:
                cycle.chunked_encoding, cycle.keep_alive = False, False
        elif self.delimited and message["type"] == "http.response.body":
            cycle.expected_content_length = len(message.get("body", b""))  # each message: as long as it is
        await self.send(message)  # type: ignore[arg-type]
