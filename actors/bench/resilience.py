"""The *crash under streams* workload: 16 greedy streams while the batcher is crashed 3 times.

Each stream's text must equal an uninterrupted run's, up to a near-tie: a resumed stream has its
prompt and generated tokens recomputed in one chunk, another batch shape than the uninterrupted
run's, so its greedy choice may flip where the two best tokens nearly tie (``NEAR_TIE``, as in the
tests). Where two texts part, a lone decode of the common prefix tells the top-2 logit margin.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import llamactor
from llamactor.bench.prompts import uniform_prompts
from llamactor.bench.settings import BenchSettings
from llamactor.native.engine import Engine

N_STREAMS, N_CRASHES, NEAR_TIE = 16, 3, 1.25


def top2_margin(engine: Engine, tokens: list[int]) -> float:
    """Best minus second-best next-token logit after ``tokens``, decoded alone."""
    engine.clear()
    engine.prefill(0, tokens[:-1])
    n = len(tokens)
    logits = engine.decode(np.array(tokens[-1:], np.int32), np.array([n - 1], np.int32), np.zeros(1, np.int32),
                           np.ones(1, np.int8)).logits[0]
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def _stream_all(llm: llamactor.LLM, prompts: list[str], max_tokens: int, crash_at: list[int]) -> list[Any]:
    """Stream every prompt at once; crash the batcher when the streams together have received each
    piece count in ``crash_at``. A stream's result is its Completion and joined pieces, or its error."""
    lock, received, crashes = threading.Lock(), [0], list(crash_at)

    def one(prompt: str) -> Any:
        stream = llm.stream(prompt, max_tokens=max_tokens, temperature=0, ignore_eos=True)
        pieces = []
        try:
            for piece in stream:
                pieces.append(piece)
                with lock:
                    received[0] += 1
                    if crashes and received[0] >= crashes[0]:
                        crashes.pop(0)
                        llm.inject_crash()
            return stream.completion, "".join(pieces)
        except llamactor.LlamactorError as e:
            return e

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


def bench_crash_streams(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    max_tokens = 48 if s.quick else 96
    prompts = uniform_prompts(N_STREAMS)
    total = N_STREAMS * max_tokens
    crash_at = [total * (i + 1) // (N_CRASHES + 1) for i in range(N_CRASHES)]
    with llamactor.start(s.model_path, n_parallel=N_STREAMS, n_ctx=s.n_ctx, n_threads=s.n_threads) as llm:
        with concurrent.futures.ThreadPoolExecutor(N_STREAMS) as pool:
            uninterrupted = list(pool.map(lambda p: llm.ask(p, max_tokens=max_tokens, temperature=0, ignore_eos=True),
                                          prompts))
        tick()
        before = llm.stats()["restarts"]
        streamed = _stream_all(llm, prompts, max_tokens, crash_at)
        restarts = llm.stats()["restarts"] - before
    broken = [r for r in streamed if isinstance(r, Exception)]
    out: dict[str, Any] = {"streams": N_STREAMS, "max_tokens": max_tokens, "restarts": restarts,
                           "broken": len(broken), "errors": sorted({repr(e) for e in broken})[:3],
                           "pieces_mismatch": 0, "equal": 0, "near_tie": 0, "unexplained": 0}
    engine = Engine(s.model_path, n_ctx=2048, n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=s.n_threads)
    try:
        for prompt, plain, result in zip(prompts, uninterrupted, streamed):
            if isinstance(result, Exception):
                continue
            completion, joined = result
            out["pieces_mismatch"] += joined != completion.text or len(completion.token_ids) != max_tokens
            a, b = plain.token_ids, completion.token_ids
            if a == b:
                out["equal"] += 1
                continue
            i = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
            margin = top2_margin(engine, engine.tokenizer.tokenize(prompt) + list(a[:i]))
            out["near_tie" if margin < NEAR_TIE else "unexplained"] += 1
    finally:
        engine.close()
    tick()
    return out
