"""Chaos through the real daemon: poison requests beside 16 good streams. The good streams all
finish, the model never leaves ``ready`` (its /health, read at each piece of a stream, and the
daemon's log: no ``batcher_failed``), no restart is counted.

The poisons are ones that reached the batcher over HTTP before the edge knew them (``seed: -1``,
a lone surrogate in the prompt, a ``tool_calls`` entry without ``function``); whether the edge now
refuses one (4xx), gives it a meaning (``seed: -1`` is "random" in llama-server) or the batcher
fails it alone (500), each gets its own answer, never a 503, and the others never notice.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.support.daemon import API_KEY, MODEL_ID, Daemon, metric, start_daemon

N_STREAMS = 16
REPLICA0 = r'\{model="' + MODEL_ID + r'",replica="0"\}'  # the labels of the only replica
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
POISONS = {  # path, raw JSON body (a lone surrogate is valid JSON, but no Python str can be encoded to send it)
    "seed": ("/v1/completions", json.dumps({"model": MODEL_ID, "prompt": "The sea is", "max_tokens": 4, "seed": -1})),
    "surrogate": ("/v1/completions", '{"model": "%s", "prompt": "tell me \\ud800 more", "max_tokens": 4}' % MODEL_ID),
    "tool_calls": ("/v1/chat/completions", json.dumps({
        "model": MODEL_ID, "max_tokens": 4, "tools": TOOLS, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function"}]},
            {"role": "user", "content": "again"}]})),
}


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "8", "--api-key", API_KEY, "--batch-timeout-ms", "5")
    yield d
    assert d.stop() == 0


def stream_one(http: httpx.Client, i: int, first_piece: threading.Event, health: list[str] | None) -> str:
    """Stream one greedy completion to its end; returns its finish reason. With ``health``, the
    daemon's /health status is read at each piece."""
    body = {"model": MODEL_ID, "prompt": f"Story number {i}:", "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "stream": True}
    finish = ""
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[len("data: "):])
            assert "error" not in data, data  # e.g. the model went away under it
            choice = data["choices"][0]
            first_piece.set()
            finish = choice.get("finish_reason") or finish
            if health is not None:
                health.append(http.get("/health").json()["status"])
    return finish


@pytest.mark.timeout(300)
def test_poison_requests_beside_sixteen_streams_fail_alone_and_the_model_stays_ready(daemon: Daemon) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    health: list[str] = []
    with httpx.Client(base_url=daemon.url, headers=headers, timeout=120) as http, \
            concurrent.futures.ThreadPoolExecutor(N_STREAMS) as pool:
        started = threading.Event()
        streams = [pool.submit(stream_one, http, i, started, health if i == 0 else None) for i in range(N_STREAMS)]
        assert started.wait(120)  # the streams run: the poisons arrive between their steps
        answers = {name: http.post(path, content=body.encode()) for name, (path, body) in POISONS.items()}
        finishes = [s.result(timeout=240) for s in streams]
        metrics = http.get("/metrics").text
    assert finishes == ["length"] * N_STREAMS
    for name, answer in answers.items():
        assert answer.status_code != 503 and (answer.status_code == 200 or 400 <= answer.status_code < 600), \
            (name, answer.status_code, answer.text)
    assert 400 <= answers["tool_calls"].status_code < 600  # a malformed history is never a success
    assert health and set(health) == {"ready"}, health
    assert not daemon.events("batcher_failed") and not daemon.events("batcher_restarting")
    assert metric(metrics, "llamactor_batcher_restarts_total" + REPLICA0) == 0
    # each failed alone the first time: none quarantined (the series is there, at 0)
    assert re.search("^llamactor_requests_quarantined_total" + REPLICA0 + r" 0\.0$", metrics, re.M), metrics[-2000:]
