"""The daemon's HTTP protocol (``http.edge_protocol``: httptools with a deadline on each request
head and a bound on an incomplete one) on a real uvicorn server in this process, with the
daemon's uvicorn settings (``daemon.uvicorn_config``), through raw sockets. The app is a small
ASGI app of the test's own: what is tested is the protocol under it. The same defences through
the whole daemon: ``test_transport.py``."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest
import uvicorn

from llamactor.base.config import Config
from llamactor.http.body_limit import Receive, Scope, Send
from llamactor.http.daemon import uvicorn_config
from llamactor.http.edge_protocol import BoundedHead

pytestmark = pytest.mark.pure

HEAD_TIMEOUT_S = 1.0  # long enough that a loaded machine reads a prompt head before it
MAX_HEAD = 4096
SOCKET_WAIT_S = 20  # a bounded wait on a socket: the server answers (or closes) well before


class HeldResponse:
    """An ASGI app: ``/held`` sends its start and first chunk, then its end once ``release`` is
    called; any other path answers ``ok`` at once (uvicorn's event loop)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.released: asyncio.Event | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.loop = asyncio.get_running_loop()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        if scope["path"] == "/held":
            self.released = released = asyncio.Event()  # made before the first chunk, which the test waits for
            await send({"type": "http.response.body", "body": b"first ", "more_body": True})
            await released.wait()
        await send({"type": "http.response.body", "body": b"ok"})

    def release(self) -> None:
        assert self.loop is not None and self.released is not None
        self.loop.call_soon_threadsafe(self.released.set)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, HeldResponse]]:
    app = HeldResponse()
    listener = socket.create_server(("127.0.0.1", 0))  # bound first: connections wait in its backlog
    transport = Config(header_timeout_s=HEAD_TIMEOUT_S, max_header_bytes=MAX_HEAD, keep_alive_s=60)
    config = uvicorn_config(app, transport, host="127.0.0.1", port=0)
    assert issubclass(config.http, BoundedHead)  # type: ignore[arg-type]
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    yield listener.getsockname()[1], app
    uv.should_exit = True
    thread.join(timeout=30)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=SOCKET_WAIT_S)


def read_until_closed(sock: socket.socket) -> bytes:
    """What arrives until the server closes ``sock`` (a timeout fails the test: never closed)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def read_until(sock: socket.socket, end: bytes) -> bytes:
    received = b""
    while not received.endswith(end):
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    return received


def get(path: str, *headers: str) -> bytes:
    return "\r\n".join([f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]).encode()


def test_a_head_not_whole_by_the_deadline_is_closed_and_a_long_answer_is_not(server: tuple[int, HeldResponse]) -> None:
    port, app = server
    with connect(port) as held, connect(port) as trickled, connect(port) as kept:
        held.sendall(get("/held"))
        assert b"first " in read_until(held, b"first \r\n")
        trickled.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
        kept.sendall(get("/"))
        assert read_until(kept, b"0\r\n\r\n").startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET / HTTP/1.1\r\n")  # after its answer: the next head has the deadline too
        assert read_until_closed(trickled) == b"" and read_until_closed(kept) == b""
        # both deadlines have passed; the held answer, whose head came whole, is still open
        app.release()
        assert read_until(held, b"0\r\n\r\n").endswith(b"ok\r\n0\r\n\r\n")


def test_an_incomplete_head_over_the_limit_gets_400_and_is_closed(server: tuple[int, HeldResponse]) -> None:
    port, _ = server
    padding = b"X-Padding: " + b"a" * MAX_HEAD  # just over: the last piece crosses it (none is left unread)
    with connect(port) as one_read, connect(port) as trickled:
        one_read.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + padding)
        answer = read_until_closed(one_read)
        assert answer.startswith(b"HTTP/1.1 400") and answer.endswith(b"Invalid HTTP request received."), answer
        trickled.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for start in range(0, len(padding), 512):  # in pieces: what the reads add up to counts
            trickled.sendall(padding[start:start + 512])
        assert read_until_closed(trickled).startswith(b"HTTP/1.1 400")
    with connect(port) as whole:  # a head within the limit, however it arrives, is served
        whole.sendall(get("/", "X-Padding: " + "a" * (MAX_HEAD // 2)))
        assert read_until(whole, b"0\r\n\r\n").startswith(b"HTTP/1.1 200")


def test_a_pipelined_head_after_a_large_body_is_not_counted_with_the_body(server: tuple[int, HeldResponse]) -> None:
    port, _ = server
    body = b"b" * (4 * MAX_HEAD)
    post = (f"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    second = get("/", "Connection: close")
    with connect(port) as sock:
        sock.sendall(post + second[:20])  # one write: the second head begins right after the body
        first = read_until(sock, b"0\r\n\r\n")
        sock.sendall(second[20:])
        rest = read_until_closed(sock)
    assert first.startswith(b"HTTP/1.1 200") and rest.startswith(b"HTTP/1.1 200"), (first[:100], rest[:100])


def test_an_http_1_0_client_gets_its_stream_unchunked_and_ended_by_the_close(server: tuple[int, HeldResponse]) -> None:
    port, app = server
    with connect(port) as sock:
        sock.sendall(b"GET /held HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        head = read_until(sock, b"first ")
        app.release()
        rest = read_until_closed(sock)
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower(), head
    assert head.endswith(b"\r\n\r\nfirst ") and rest == b"ok"
