"""OpenAI's Batch API against a daemon (tests/support/daemon.py): input lines, uploads and a
job's outcome, waited for on the daemon's log (used by the batch tests in tests/http/ and
tests/tree/test_data_at_rest.py)."""

from __future__ import annotations

import io
import json
from typing import Any

import openai
from openai.types import Batch

from tests.support.daemon import MODEL_ID, Daemon

SYSTEM = "You are a terse assistant. Answer in a few words."


def chat_line(custom_id: str, question: str, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL_ID, "max_tokens": max_tokens, "temperature": 0,
                     "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                     **extra}}


def jsonl(lines: list[Any]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def upload(client: openai.OpenAI, data: bytes) -> str:
    return client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id


def finished(d: Daemon, batch_id: str, timeout: float = 120) -> Batch:
    """The batch once its job has logged ``job_finished`` (an event, not a poll)."""
    assert d.wait_for_log(lambda line: line.get("event") == "job_finished" and line.get("batch_id") == batch_id,
                          timeout), f"{batch_id} did not finish"
    return d.client().batches.retrieve(batch_id)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]
