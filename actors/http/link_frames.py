"""The wire between the engine's process and a front-end process (docs/performance.md, *Host cap
(front end)*): length-prefixed pickled frames over one Unix stream socket, and what they carry.

Both ends are this program, joined by a ``socketpair`` the daemon made (never a listening
address), so pickle is safe here; it also carries the frozen request messages as they are (their
``ReplyChannel`` travels empty: ``ReplyChannel.__reduce__``), every typed error with its details,
and whole ``Completion``s. The engine sends a step's replies as one ``EVENTS`` frame of
``(token, kind, value)`` triples, where ``token`` is the front end's number for one message: a
plain text piece travels as its text alone, not as a ``Piece`` object.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from typing import Any

from llamactor.base.completion import Parts, Piece
from llamactor.base.errors import EngineError

HEADER = struct.Struct("!I")  # a frame's byte length

# front end -> engine
SEND = "send"  # (SEND, model, [(token, message)], stream)
CANCEL = "cancel"  # (CANCEL, model, request_id)
CALL = "call"  # (CALL, call_id, method, model, args): a blocking question (load, stats, describe ...)
# (LIMITED, group, tenant, tokens, [(model, [(token, message)], stream)]): the messages a tenant's
# request sent within its rate limits (``link_state``), reserved on arrival
LIMITED = "limited"
SETTLE = "settle"  # (SETTLE, group, used): the group's request has ended, having used ``used`` tokens
# engine -> front end
EVENTS = "events"  # (EVENTS, [(token, kind, value)]): every reply posted since the last frame
RESULT = "result"  # (RESULT, call_id, ok, value): a CALL's answer
STATUS = "status"  # (STATUS, name, ModelView): a model loaded, unloaded or failed to load
READY = "ready"  # (READY, [ModelView]): the engine's models are served (the router exists)

# an event's kind; LIMITS: (group, LIMITS, Limits | None), what the tenant has left (None: refused),
# before any event of the group's messages. A piece's kinds come last (``kind >= PIECE``): the
# reader asks that first. PARTS: a piece without logprobs as the tuple (text, reasoning, content,
# calls), where a pickled ``Piece`` and its ``Parts`` cost several µs each to rebuild (a chat's
# text the splitter holds back, a reasoning model's thinking)
QUEUED, OK, ERROR, LIMITS, PIECE, TEXT, CONTENT, PARTS = range(8)


class FrameWriter:
    """Writes frames on ``sock`` from any thread (one frame at a time: a lock)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()

    def write(self, obj: Any) -> None:
        """OSError when the other end is gone."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._sock.sendall(HEADER.pack(len(data)) + data)

    def try_write(self, obj: Any) -> bytes | bool:
        """Never blocks: True once the whole frame is written, False if nothing was (the socket's
        buffer full, or another thread writing), else the frame's unwritten rest -- this writer's
        lock then stays taken until ``finish(rest)`` (any thread) writes it. OSError when gone."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            buffer = HEADER.pack(len(data)) + data
            try:
                sent = self._sock.send(buffer, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
        except BaseException:
            self._lock.release()
            raise
        if sent == len(buffer) or sent == 0:
            self._lock.release()
            return sent > 0
        return buffer[sent:]

    def finish(self, rest: bytes | None) -> None:
        """Any thread: the rest of a frame ``try_write`` began, then the lock it kept released
        (``rest`` None: the link is closing, the frame is given up, the lock released alone)."""
        try:
            if rest is not None:
                self._sock.sendall(rest)
        finally:
            self._lock.release()


class FrameReader:
    """Reads frames from ``sock`` (one thread)."""

    def __init__(self, sock: socket.socket) -> None:
        self._file = sock.makefile("rb")

    def read(self) -> Any | None:
        """The next frame's object; None once the other end closed (or the socket failed)."""
        try:
            head = self._file.read(HEADER.size)
            if len(head) < HEADER.size:
                return None
            (size,) = HEADER.unpack(head)
            body = self._file.read(size)
        except OSError:
            return None
        return pickle.loads(body) if len(body) == size else None


def piece_event(token: int, piece: Piece) -> tuple[int, int, Any]:
    """A piece as few bytes as say it: its text alone where it has no logprobs and its parts (if
    any) are all content; without logprobs, its parts as a tuple."""
    if not piece.logprobs:
        parts = piece.parts
        if parts is None:
            return token, TEXT, piece.text
        if not parts.reasoning and not parts.calls and parts.content == piece.text:  # no Parts made per token
            return token, CONTENT, piece.text
        return token, PARTS, (piece.text, parts.reasoning, parts.content, parts.calls)
    return token, PIECE, piece


def event_piece(kind: int, value: Any) -> Piece:
    """The ``Piece`` a piece event stands for."""
    if kind == CONTENT:
        return Piece(value, (), Parts(content=value))
    if kind == TEXT:
        return Piece(value)
    if kind == PARTS:
        return Piece(value[0], (), Parts(value[1], value[2], value[3]))
    return value  # type: ignore[no-any-return]


def portable_error(error: BaseException) -> BaseException:
    """``error`` if it pickles (typed errors do, details and all), else an ``EngineError`` naming it."""
    try:
        pickle.dumps(error)
    except Exception:  # noqa: BLE001 - whatever an unpicklable exception raises
        return EngineError(f"the engine failed: {error!r}")
    return error


def sendable(events: list[tuple[int, int, Any]]) -> list[tuple[int, int, Any]]:
    """``events`` with each whose value does not pickle replaced by an ``EngineError`` for its own
    request (``ERROR``): the frame's other events go on as they were."""
    out = []
    for token, kind, value in events:
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - whatever an unpicklable value raises
            value, kind = EngineError(f"a reply could not be sent to the front end: {e!r}"), ERROR
        out.append((token, kind, value))
    return out
