"""Shared fixtures: the real default model, real actor trees, cleaned up pykka-style."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

# Nothing the tests run phones home (the daemons they start inherit these): Ray's usage stats,
# Hugging Face's hub, LiteLLM's cost map.
for _name, _value in (("RAY_USAGE_STATS_ENABLED", "0"), ("HF_HUB_OFFLINE", "1"), ("LITELLM_LOCAL_MODEL_COST_MAP", "True")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402 - after the environment above, which importing these may read
import pykka
import pytest

import llamactor
from llamactor.base.messages import AuditKv
from llamactor.base.models import default_model_path, instruct_model_path
from llamactor.native.engine import Engine

# Holds every test to its ``pure`` marker (model-free), watching every model load: see there.
pytest_plugins = ["tests.support.pure_marker"]

# Greedy decoding of the same sequence in differently shaped batches can flip between two
# tokens whose logits are this close. With Q4_K on the CPU, llama.cpp picks other matmul kernels
# (and activation quantizations) for other batch sizes: the same 30-token prompt prefilled as
# 25 + 5 tokens instead of 30 at once moved its next-token logits by up to 1.08 (mean 0.32).
NEAR_TIE = 1.25


@pytest.fixture(scope="session")
def model_path() -> str:
    return default_model_path()


@pytest.fixture(scope="session")
def instruct_path() -> str:
    """SmolLM2-135M-Instruct: an instruct model with a ChatML template in its GGUF (llama
    architecture, 49k vocabulary), beside the base Gemma that has none."""
    return instruct_model_path()


@pytest.fixture(scope="module")
def llm(model_path: str) -> Iterator[llamactor.LLM]:
    """One actor tree shared by a module's read-only tests (4 sequences, a short window)."""
    handle = llamactor.start(model_path, n_parallel=4, n_ctx=4096, batch_timeout_ms=20)
    yield handle
    handle.close()


@contextlib.contextmanager
def closing_what_the_test_started() -> Iterator[list[Any]]:
    """Yields a list for the handles a test starts; closes them after it, then stops every actor
    new since it began (like pykka's own tests, but sparing module-scoped trees)."""
    handles: list[Any] = []
    before = set(pykka.ActorRegistry.get_all())
    yield handles
    for handle in handles:
        handle.close()
    for ref in set(pykka.ActorRegistry.get_all()) - before:
        ref.stop()


@pytest.fixture
def start_llm(model_path: str) -> Iterator[object]:
    """Start a tree with the given options (``model``: a GGUF other than the default Gemma); every
    tree and actor the test started is stopped after it."""
    with closing_what_the_test_started() as handles:
        def start(model: str | None = None, **options: object) -> llamactor.LLM:
            options.setdefault("n_ctx", 2048)
            handles.append(llamactor.start(model or model_path, **options))
            return handles[-1]

        yield start


def record_sent(handle: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The messages ``handle`` (an ``LLM``) hands to its actors from now on, each still delivered."""
    sent: list[Any] = []
    monkeypatch.setattr(handle, "send", lambda msg, send=handle.send: (sent.append(msg), send(msg))[1])
    return sent


class NotAMessage:
    """An unknown message type is a bug: a batcher told one raises, and so crashes (tests do it on purpose)."""


def batcher_ref(llm: llamactor.LLM) -> pykka.ActorRef:
    """The current batcher of ``llm``'s supervisor (tests crash it on purpose)."""
    return llm._supervisor.proxy().batcher.get()


def cancel_a_story_after_its_first_piece(llm: llamactor.LLM) -> None:
    """A long stream cancelled by its caller once its first piece arrived: the rest raises."""
    stream = llm.stream("Tell me a long story about a lighthouse", max_tokens=100, ignore_eos=True)
    pieces = iter(stream)
    next(pieces)
    stream.cancel()
    with pytest.raises(llamactor.CancelledError):
        list(pieces)


def audit_kv(llm: llamactor.LLM) -> list[str]:
    """Where the batcher's prefix index and llama.cpp's cells disagree (asked on the batcher's thread)."""
    return batcher_ref(llm).ask(AuditKv(), timeout=30)


@pytest.fixture(scope="session")
def reference_engine(model_path: str) -> Iterator[Engine]:
    """A bare engine that decodes one sequence alone: the reference for near-tie margins."""
    e = Engine(model_path, n_ctx=2048, n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=2)
    yield e
    e.close()


class ReferenceEngines(dict[str, Engine]):
    """A lone-decode reference engine per KV type, made on first use."""

    def __init__(self, model_path: str, f16: Engine) -> None:
        super().__init__(f16=f16)
        self.model_path = model_path

    def __missing__(self, kv_type: str) -> Engine:
        self[kv_type] = Engine(self.model_path, n_ctx=2048, n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=2,
                               kv_type=kv_type)
        return self[kv_type]


@pytest.fixture(scope="session")
def reference_engines(model_path: str, reference_engine: Engine) -> Iterator[ReferenceEngines]:
    """``reference_engine`` per KV type: the near-tie margins of runs on a quantized KV cache are
    read from a lone decode on the same cache type."""
    engines = ReferenceEngines(model_path, reference_engine)
    yield engines
    for kv_type, e in engines.items():
        if kv_type != "f16":
            e.close()


def decode_prompt(engine: Engine, seq_id: int, tokens: list[int], n_past: int = 0) -> np.ndarray:
    """Decode ``tokens`` on ``seq_id`` from ``n_past`` in one batch; a copy of the last row's logits."""
    n = len(tokens)
    result = engine.decode(np.array(tokens, np.int32), np.arange(n_past, n_past + n, dtype=np.int32),
                           np.full(n, seq_id, np.int32), np.array([0] * (n - 1) + [1], np.int8))
    assert not result.failed_seq_ids
    return result.logits[0].copy()


def top2_margin(engine: Engine, tokens: list[int]) -> float:
    """Logit gap between the best and second-best next token after ``tokens``, decoded alone."""
    engine.clear()
    engine.prefill(0, tokens[:-1])  # in n_batch chunks: prompts may be longer than one batch
    top = np.sort(decode_prompt(engine, 0, tokens[-1:], n_past=len(tokens) - 1))[-2:]
    return float(top[1] - top[0])


def assert_equal_up_to_near_tie(engine: Engine, prompt_tokens: list[int], a: llamactor.Completion,
                                b: llamactor.Completion) -> None:
    """Two greedy completions of one prompt agree, or first differ where the model nearly tied."""
    if a.token_ids == b.token_ids:
        return
    i = next((k for k, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
    if i is None:  # one is a prefix of the other: it must have chosen EOG where the other went on
        shorter = min((a, b), key=lambda c: len(c.token_ids))
        assert shorter.finish_reason == "stop", "one completion is a strict prefix of the other"
        i = len(shorter.token_ids)
    margin = top2_margin(engine, prompt_tokens + list(a.token_ids[:i]))
    assert margin < NEAR_TIE, f"outputs diverged at token {i} although the top-2 logit margin was {margin:.3f}"
