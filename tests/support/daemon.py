"""Start ``llamactor serve`` as a real subprocess on a free loopback port, and stop it; compare what it
answers (greedy completions up to a near-tie, /metrics values) and wait, bounded, for what it publishes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import openai

from tests.conftest import NEAR_TIE

T = TypeVar("T")

API_KEY = "sk-test-key"
MODEL_ID = "gemma-3-270m-q4_k_m"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    process: subprocess.Popen[str]
    port: int
    log_lines: list[dict] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    new_line: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, api_key: str = API_KEY, **kw: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **kw)

    def events(self, name: str) -> list[dict]:
        return [line for line in self.log_lines if line.get("event") == name]

    def wait_for_log(self, predicate: Callable[[dict], bool], timeout: float = 30) -> bool:
        """Block until a log line (already seen or still to come) satisfies ``predicate``."""
        with self.new_line:
            return self.new_line.wait_for(lambda: any(predicate(line) for line in self.log_lines), timeout)

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def start_daemon(*args: str, wait_ready: bool = True, timeout: float = 120) -> Daemon:
    port = free_port()
    cmd = [sys.executable, "-m", "llamactor.cli", "serve", "--port", str(port), "--log-format", "json",
           "--log-level", "info", "--n-ctx", "4096", *args]
    # batch jobs live in a data dir of the test's own unless it passes --data-dir (never the user's)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={"LLAMACTOR_DATA_DIR": tempfile.mkdtemp(prefix="llamactor-data-"), **os.environ,
                                 "PYTHONUNBUFFERED": "1"})
    daemon = Daemon(proc, port)

    def read_logs() -> None:  # the daemon's JSON log lines tell us when it is ready
        assert proc.stderr is not None
        for raw in proc.stderr:
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                line = {"event": "raw", "text": raw.rstrip()}
            with daemon.new_line:
                daemon.log_lines.append(line)
                daemon.new_line.notify_all()
            if line.get("event") in ("model_ready", "router_ready"):  # a folder of models may preload none
                daemon.ready.set()
        daemon.ready.set()  # exited: nobody will say ready

    threading.Thread(target=read_logs, daemon=True).start()
    if wait_ready:
        assert daemon.ready.wait(timeout), "daemon did not become ready"
        assert proc.poll() is None, f"daemon exited: {daemon.log_lines[-5:]}"
    return daemon


def wait_until(condition: Callable[[], T], what: str, timeout: float = 30, poll_s: float = 0.02) -> T:
    """Poll ``condition`` (a short sleep between polls) until it returns something truthy, and
    return that; fail naming ``what`` at the deadline. For states only observable by asking
    (published stats, /health), where no event or future tells us when they change."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(poll_s)
    return result


# -- comparing greedy completions over HTTP -------------------------------------------------
# The same greedy request decoded twice (streamed and not, alone and in a batch, on two
# replicas) may differ after a near-tie: llama.cpp's kernels differ by batch shape (see
# conftest.NEAR_TIE). The server's top-2 log-probabilities tell where: a log-probability gap is
# the logit gap, and where two decodes first chose differently (a in one, b in the other) their
# two top-2 gaps add up to at most twice the logit noise, so the smaller is under it.


@dataclass(frozen=True)
class GreedyStep:
    token: str
    margin: float  # top-1 minus top-2 log-probability where the token was chosen


def _margin(logprobs: Iterable[float]) -> float:
    top = sorted(logprobs, reverse=True)
    return top[0] - top[1] if len(top) > 1 else 0.0  # one entry: two alternatives with one text


def legacy_steps(tokens: list[str], top_logprobs: list[dict[str, float]]) -> list[GreedyStep]:
    """From a legacy completion's ``logprobs`` (asked with ``logprobs=2`` or more)."""
    return [GreedyStep(t, _margin(top.values())) for t, top in zip(tokens, top_logprobs, strict=True)]


def chat_steps(content: list[Any]) -> list[GreedyStep]:
    """From a chat choice's ``logprobs.content`` (asked with ``top_logprobs=2`` or more)."""
    return [GreedyStep(t.token, _margin(a.logprob for a in t.top_logprobs)) for t in content]


def assert_same_greedy_text_up_to_near_tie(a: tuple[str, list[GreedyStep], str | None],
                                           b: tuple[str, list[GreedyStep], str | None]) -> None:
    """Two greedy completions of one prompt, each ``(text, steps, finish_reason)``: the same text,
    or the same tokens up to where one of them nearly tied."""
    (text_a, steps_a, finish_a), (text_b, steps_b, finish_b) = a, b
    tokens_a, tokens_b = [s.token for s in steps_a], [s.token for s in steps_b]
    if tokens_a == tokens_b:
        assert text_a == text_b, "the same tokens gave two texts"
        return
    i = next((k for k, (x, y) in enumerate(zip(tokens_a, tokens_b)) if x != y), None)
    if i is None:  # one is a prefix of the other: it stopped where the other went on
        shorter, longer = (finish_a, steps_b) if len(steps_a) < len(steps_b) else (finish_b, steps_a)
        assert shorter == "stop", "one completion is a strict prefix of the other"
        i = min(len(steps_a), len(steps_b))
        margin = longer[i].margin  # the one that went on had EOG (or a stop) close behind
    else:
        margin = min(steps_a[i].margin, steps_b[i].margin)
    assert margin < NEAR_TIE, (f"outputs diverged at token {i} ({tokens_a[i:i + 1]} vs {tokens_b[i:i + 1]}) "
                               f"although the top-2 log-probability gap was {margin:.3f}")


def legacy_result(choice: Any) -> tuple[str, list[GreedyStep], str | None]:
    """A legacy completion choice (asked with ``logprobs=2``), for the comparison above."""
    return choice.text, legacy_steps(choice.logprobs.tokens, choice.logprobs.top_logprobs), choice.finish_reason


def chat_result(choice: Any) -> tuple[str, list[GreedyStep], str | None]:
    """A chat choice (asked with ``logprobs=True, top_logprobs=2``), for the comparison above."""
    return choice.message.content or "", chat_steps(choice.logprobs.content), choice.finish_reason


def ollama_result(response: Any) -> tuple[str, list[GreedyStep], str | None]:
    """An Ollama ``generate`` response (asked with ``logprobs=True, top_logprobs=2``), for the
    comparison above (Ollama's ``done_reason`` is the finish reason)."""
    return response.response, chat_steps(response.logprobs or []), response.done_reason


def streamed_legacy_result(chunks: Iterable[Any]) -> tuple[str, list[GreedyStep], str | None]:
    """Choice 0 of a streamed legacy completion (asked with ``logprobs=2``), joined."""
    text, tokens, tops, finish = "", [], [], None
    for chunk in chunks:
        for c in chunk.choices:
            text += c.text
            if c.logprobs:
                tokens += c.logprobs.tokens
                tops += c.logprobs.top_logprobs
            finish = c.finish_reason or finish
    return text, legacy_steps(tokens, tops), finish


def streamed_chat_result(chunks: Iterable[Any]) -> tuple[str, list[GreedyStep], str | None]:
    """Choice 0 of a streamed chat completion (asked with ``logprobs=True, top_logprobs=2``), joined."""
    text, content, finish = "", [], None
    for chunk in chunks:
        for c in chunk.choices:
            text += c.delta.content or ""
            content += c.logprobs.content if c.logprobs and c.logprobs.content else []
            finish = c.finish_reason or finish
    return text, chat_steps(content), finish


def metric(metrics: str, series: str) -> float:
    """The value of ``series`` (a regex: name and labels) in a /metrics text; 0 while it is absent
    (a counter's labelled series appears on its first increment)."""
    found = re.search("^" + series + r" (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0
