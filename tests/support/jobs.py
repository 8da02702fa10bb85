"""Batch jobs without a model: input lines, a journal's batch, and a fake client whose futures
the test resolves (used by tests/jobs/test_jobs.py and tests/jobs/test_poison_lines.py)."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from typing import Any

from llamactor.base.completion import Completion, Timings, Usage
from llamactor.base.config import Config
from llamactor.base.errors import QueueFullError
from llamactor.base.messages import CallerMessage, Generate
from llamactor.handles.client import Client
from llamactor.jobs import records
from llamactor.jobs.endpoints import check_body
from llamactor.jobs.input_lines import read_input_lines
from llamactor.jobs.runner import JobRunner
from llamactor.jobs.journal import JobStore

CHAT = "/v1/chat/completions"


def line(custom_id: Any, content: str = "hi", system: str | None = None, url: str = CHAT, **body: Any) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                       "body": {"model": "m", "messages": messages, "max_tokens": 4, **body}})


def read(*lines: str) -> list[Any]:
    return read_input_lines("\n".join(lines).encode(), CHAT, check_body)


def new_batch(store: JobStore, *lines: str, batch_id: str = "batch_t") -> str:
    store.create_batch({"id": batch_id, "status": "validating", "created_at": 0})
    read_lines = read(*lines)
    store.add_lines(batch_id, read_lines, {p.line_no: records.invalid_line(batch_id, p.line_no, p.custom_id, *p.error)
                                           for p in read_lines if p.error})
    return batch_id


class FakeClient(Client):
    """Hands each message to the test, which resolves its future; counts what is outstanding."""

    def __init__(self, refuse_first: int = 0) -> None:
        self.config = Config()
        self.sent: list[Generate] = []
        self.outstanding = 0
        self.most_outstanding = 0
        self.refuse_first = refuse_first
        self.changed = threading.Condition()

    def send(self, msg: CallerMessage) -> concurrent.futures.Future[Any]:
        with self.changed:
            if self.refuse_first:
                self.refuse_first -= 1
                raise QueueFullError("full")
            assert isinstance(msg, Generate)
            self.sent.append(msg)
            self.outstanding += 1
            self.most_outstanding = max(self.most_outstanding, self.outstanding)
            msg.reply.future.add_done_callback(lambda _f: self._done())
            self.changed.notify_all()
        return msg.reply.future

    def _done(self) -> None:
        with self.changed:
            self.outstanding -= 1

    def cancel(self, request_id: str) -> None:
        pass

    def next_message(self, index: int) -> Generate:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.sent) > index, 10), "the runner sent nothing"
            return self.sent[index]


def answer(msg: Generate, text: str = "ok") -> None:
    msg.reply.future.set_result(Completion(msg.request_id, text, (1,), "stop", Usage(5, 1, 0), Timings(0, 0, 0, 0)))


def run_in_thread(runner: JobRunner) -> tuple[threading.Thread, list[bool]]:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(runner.run()), daemon=True)
    thread.start()
    return thread, result
