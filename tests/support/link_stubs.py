"""Stubs for the tests of the engine's link to a front-end process (tests/http/test_engine_link.py,
tests/http/test_link_state.py): a model that keeps what it is sent and lets the test answer on
the channels, as a batcher would, and a router of that one model."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

from llamactor.base.messages import Generate, ReplyChannel
from llamactor.base.sampling import SamplingParams
from tests.support.stub_tree import INFO

TIMEOUT = 5.0


class StubModel:
    """Keeps what it is sent; the test answers on the channels (as a batcher would)."""

    loaded = True
    info = INFO

    def __init__(self) -> None:
        self.sent: list[Generate] = []
        self.cancelled: list[str] = []
        self.arrived = threading.Semaphore(0)
        self.cancel_seen = threading.Event()

    def send(self, msg: Generate) -> concurrent.futures.Future[Any]:
        self.sent.append(msg)
        self.arrived.release()
        return msg.reply.future

    def send_n(self, msgs: list[Generate]) -> list[concurrent.futures.Future[Any]]:
        return [self.send(m) for m in msgs]

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)
        self.cancel_seen.set()

    def replica_stats(self, *, exact: bool = False) -> list[dict[str, Any]]:
        return [{"state": "ready", "exact": exact}]


class StubRouter:
    names = ["m"]

    def __init__(self) -> None:
        self.stub = StubModel()
        self.status_listeners: list[Any] = []

    def model(self, name: str | None = None) -> StubModel:
        return self.stub


def generate(request_id: str, on_piece: Any = None) -> Generate:
    return Generate(request_id=request_id, params=SamplingParams(), reply=ReplyChannel(on_piece=on_piece),
                    submitted_at=0.0, text="hi")


def sent(stub: StubModel, n: int) -> list[Generate]:
    for _ in range(n):
        assert stub.arrived.acquire(timeout=TIMEOUT)
    return stub.sent[-n:]
