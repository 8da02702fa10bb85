"""The ``host_cap`` workload's HTTP client, run in a process of its own so that it never takes the
server's GIL: N concurrent chat completions on raw asyncio sockets (no client library: parsing
25k SSE events a second must cost the client less than the server), streamed or not.

``python -m llamactor.bench.http_load URL N MAX_TOKENS {stream,plain}`` prints one JSON object:
``tokens`` (the usage's completion tokens, summed), ``seconds`` (first request sent to last
response read), ``events`` (SSE ``data:`` events read) and ``errors`` (responses that were not a
whole 200: a status other than 200, no usage, or a stream without ``[DONE]``). Every connection
is opened before the clock starts, so the figure is the server's, not connection setup's.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from typing import Any
from urllib.parse import urlsplit

MODEL_ID = "bench-model"


def chat_messages(i: int) -> list[dict[str, str]]:
    """Request ``i``'s conversation (the in-process legs send the same)."""
    return [{"role": "user", "content": f"Customer {i}: a short story about {i}."}]


def request_bytes(host: str, i: int, max_tokens: int, stream: bool) -> bytes:
    """One chat completion's HTTP/1.1 request (``Connection: close``: the body ends at EOF)."""
    body: dict[str, Any] = {"model": MODEL_ID, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                            "messages": chat_messages(i)}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    data = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    return head.encode() + data


def dechunk(body: bytes) -> bytes:
    """A chunked transfer-encoded body's bytes."""
    out, pos = bytearray(), 0
    while True:
        end = body.index(b"\r\n", pos)
        size = int(body[pos:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2:end + 2 + size]
        pos = end + 4 + size


def parse_response(raw: bytes, stream: bool) -> tuple[int, int]:
    """(completion tokens, SSE events) of one response; ValueError unless it is a whole 200."""
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ValueError(head.split(b"\r\n")[0].decode(errors="replace"))
    if b"transfer-encoding: chunked" in head.lower():
        body = dechunk(body)
    if not stream:
        return int(json.loads(body)["usage"]["completion_tokens"]), 0
    events = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e.startswith(b"data: ")]
    if not events or events[-1] != b"[DONE]":
        raise ValueError("the stream did not end with [DONE]")
    return int(json.loads(events[-2])["usage"]["completion_tokens"]), len(events)


class _Reader(asyncio.Protocol):
    """Appends what arrives; ``done`` resolves at EOF (event loop)."""

    def __init__(self, done: asyncio.Future[bytes]) -> None:
        self.buffer, self.done = bytearray(), done

    def data_received(self, data: bytes) -> None:
        self.buffer += data

    def eof_received(self) -> None:
        self.done.set_result(bytes(self.buffer))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(bytes(self.buffer))


async def run(url: str, n: int, max_tokens: int, stream: bool) -> dict[str, Any]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    loop = asyncio.get_running_loop()
    connections = []
    for _ in range(n):
        done: asyncio.Future[bytes] = loop.create_future()
        transport, _protocol = await loop.create_connection(functools.partial(_Reader, done), host, port)
        connections.append((transport, done))
    start = time.perf_counter()
    for i, (transport, _done) in enumerate(connections):
        transport.write(request_bytes(f"{host}:{port}", i, max_tokens, stream))
    raws = await asyncio.gather(*(done for _t, done in connections))
    seconds = time.perf_counter() - start
    tokens = events = errors = 0
    for raw in raws:
        try:
            t, e = parse_response(raw, stream)
            tokens, events = tokens + t, events + e
        except (ValueError, KeyError, IndexError) as e:
            errors += 1
            print(f"http_load: {e}", file=sys.stderr)
    return {"tokens": tokens, "seconds": seconds, "events": events, "errors": errors}


def main(argv: list[str]) -> None:
    url, n, max_tokens, mode = argv[0], int(argv[1]), int(argv[2]), argv[3]
    print(json.dumps(asyncio.run(run(url, n, max_tokens, mode == "stream"))))

if __name__ == "__main__":
    main(sys.argv[1:])
