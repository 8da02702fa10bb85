"""Sequences per context on the real models: 250 at once where no sliding window needs shadow ids
(SmolLM2), at most 126 beside a system prompt where one does (Gemma 3), a typed error beyond."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import llamactor
from llamactor.native.engine import Engine

from tests.conftest import NEAR_TIE, audit_kv, decode_prompt, top2_margin

N = 250
NEW_TOKENS = 2
FIRST_TOKEN = 1000  # SmolLM2's tokens 1000 .. 1249: ordinary word pieces
CHECKED_EVERY = 10  # against a lone decode: all 250 would take most of a minute on two cores


@pytest.fixture(scope="module")
def lone_smol(instruct_path: str) -> Iterator[Engine]:
    """SmolLM2 decoding one sequence alone: the reference each of the 250 is checked against."""
    e = Engine(instruct_path, n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=1, n_threads=2)
    yield e
    e.close()


def greedy_alone(engine: Engine, prompt: list[int], n: int) -> list[int]:
    engine.clear()
    out: list[int] = []
    logits = decode_prompt(engine, 0, prompt)
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = decode_prompt(engine, 0, out[-1:], n_past=len(prompt) + len(out) - 1)
    return out


def assert_same_greedy_up_to_near_tie(engine: Engine, prompt: list[int], got: list[int], alone: list[int]) -> None:
    if got == alone:
        return
    i = next(k for k, (x, y) in enumerate(zip(got, alone)) if x != y)
    margin = top2_margin(engine, prompt + alone[:i])
    assert margin < NEAR_TIE, f"token {i} differs from the lone decode although its top-2 margin was {margin:.3f}"


def test_250_concurrent_requests_run_in_one_context_of_a_model_without_sliding_window_layers(
        start_llm: Callable[..., llamactor.LLM], instruct_path: str, lone_smol: Engine) -> None:
    # one flush of all 250 (the batch fills at n_parallel long before the timeout), 3 cells each
    llm = start_llm(instruct_path, n_parallel=N, n_ctx=N * 8, batch_timeout_ms=10_000, max_restarts=0)
    assert llm.info.n_seq_max == 256 and not llm.info.shadow_ids
    prompts = [[FIRST_TOKEN + i] for i in range(N)]  # distinct one-token prompts: no prefix shared, one prefill step
    futures = [llm.submit(p, max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True) for p in prompts]
    completions = [f.result(timeout=300) for f in futures]
    assert all(len(c.token_ids) == NEW_TOKENS for c in completions)
    # every one finished on a seq_id of its own, its cells kept as a cached entry: 250 in one context
    stats = llm.stats()
    assert stats["prefix_cache"]["entries"] == N and stats["free_seq_ids"] >= 0
    assert audit_kv(llm) == []  # each tracked id holds exactly its positions in llama.cpp's cells
    for prompt, c in list(zip(prompts, completions))[::CHECKED_EVERY]:  # seq ids past 126 among them
        assert_same_greedy_up_to_near_tie(lone_smol, prompt, list(c.token_ids), greedy_alone(lone_smol, prompt, NEW_TOKENS))


def test_a_model_with_sliding_window_layers_refuses_more_sequences_than_its_shadow_ids_leave(
        start_llm: Callable[..., llamactor.LLM]) -> None:
    with pytest.raises(llamactor.SequenceLimitError,
                       match=r"gemma.*holds at most 128 sequence ids.*n_parallel <= 126.*asked for n_parallel=127"):
        start_llm(n_parallel=127, max_restarts=0)
    with pytest.raises(llamactor.SequenceLimitError, match=r"holds at most 128 .*asked for n_seq_ids=129"):
        start_llm(n_parallel=4, n_seq_ids=129, max_restarts=0)
