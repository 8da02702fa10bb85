"""The *scoring* leg of ``llamactor bench``: prompt log-likelihoods as lm-evaluation-harness asks.

4-choice questions, half in MMLU's form (the question and lettered options, continuations " A" ..
" D") and half in ARC's (the question alone, each answer's words the continuation), sent as
lm-eval's ``local-completions`` sends them: one request per choice, the context's and the
choice's token ids joined, ``echo`` with ``logprobs: 1``, ``max_tokens: 1``, greedy, from 8
concurrent callers in lm-eval's order (longest first). The yardstick is llama-cpp-python's
``Llama(logits_all=True)``, one request at a time: every row's log-softmax (numpy, vectorized) and
its top token -- what a llama-cpp-python user has. Both with f32 attention (``flash_attn`` off: a
prompt alone gets llama-cpp-python's numbers; batch-independent ones need ``batch_invariant``, whose
price is the ``batch_invariant`` leg). Then memory (peak RSS while scoring against
while generating, in the same tree) and generation beside a scoring load.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.bench import baselines
from llamactor.bench.measure import burst_beside_load, llamactor_burst
from llamactor.bench.prompts import WORDS, uniform_prompts
from llamactor.bench.settings import BenchSettings

CALLERS = 8


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def questions(n: int, seed: int = 19) -> list[tuple[str, list[str]]]:
    """(context, 4 continuations): MMLU-style and ARC-style alternately."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        question = _words(rng, 20, 50).capitalize() + "?"
        if i % 2 == 0:
            options = "\n".join(f"{letter}. {_words(rng, 2, 8)}" for letter in "ABCD")
            out.append((f"The following is a multiple choice question.\n\n{question}\n{options}\nAnswer:",
                        [" A", " B", " C", " D"]))
        else:
            out.append((f"Question: {question}\nAnswer:", [" " + _words(rng, 1, 6) for _ in range(4)]))
    return out


def lm_eval_requests(llm: llamactor.LLM, qs: list[tuple[str, list[str]]]) -> list[list[int]]:
    """Token ids per choice as lm-eval builds them (remote tokenizer, no BOS), longest first."""
    out = []
    for context, continuations in qs:
        ctx = list(llm.tokenize(context, add_special=False).token_ids)
        for cont in continuations:
            out.append(ctx + list(llm.tokenize(cont, add_special=False).token_ids))
    return sorted(out, key=len, reverse=True)


class RssSampler:
    """Peak resident memory of this process while running, sampled every 20 ms from /proc."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, current_rss())

    def __enter__(self) -> RssSampler:
        self.peak = current_rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _score_all(llm: llamactor.LLM, requests: list[list[int]]) -> float:
    def one(ids: list[int]) -> None:
        llm.ask(ids, max_tokens=1, temperature=0, logprobs=1, echo=True)
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(CALLERS) as pool:
        list(pool.map(one, requests))
    return time.perf_counter() - start


def bench_scoring(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    qs = questions(16 if s.quick else 48)
    out: dict[str, Any] = {"questions": len(qs), "requests": 4 * len(qs), "callers": CALLERS}
    # The host-RAM tier off: its filling with evicted prefixes (a cache bounded by cache_ram_mib, as
    # large under any long workload) would count as scoring's memory.
    with llamactor.start(s.model_path, n_parallel=16, n_threads=s.n_threads, n_ctx=s.n_ctx, flash_attn="off",
                         cache_ram_mib=0) as llm:
        requests = lm_eval_requests(llm, qs)
        out["prompt_tokens"] = sum(len(r) for r in requests)
        max_tokens = 32 if s.quick else 64
        with RssSampler() as generating:
            alone = llamactor_burst(llm, uniform_prompts(16), max_tokens)["tokens_per_s"]
        before = llm.stats()
        with RssSampler() as scoring:
            seconds = _score_all(llm, requests)
        after = llm.stats()
        out["llamactor"] = {
            "seconds": seconds, "requests_per_s": len(requests) / seconds,
            "rows_scored": after["prompt_rows_scored"] - before["prompt_rows_scored"],
            "rows_from_cache": after["prompt_rows_from_cache"] - before["prompt_rows_from_cache"],
            "prompt_tokens_computed": after["prompt_tokens_computed"] - before["prompt_tokens_computed"],
            "steps": after["steps"] - before["steps"],
            "step_ms": {k: round(v - before["step_ms"].get(k, 0.0), 1) for k, v in after["step_ms"].items()}}
        out["memory"] = {"generating_peak_rss_mib": generating.peak / 2**20, "scoring_peak_rss_mib": scoring.peak / 2**20}
        tick()
        loaded, scored = burst_beside_load(llm, max_tokens, lambda i: llm.ask(
            requests[i % len(requests)], max_tokens=1, temperature=0, logprobs=1, echo=True), CALLERS)
        out["generation"] = {"alone_tokens_per_s": alone, "beside_scoring_tokens_per_s": loaded,
                             "requests_scored_meanwhile": scored}
    tick()
    seconds = baselines.score_one_at_a_time(s.model_path, requests, s.n_threads)
    out["one_at_a_time"] = {"seconds": seconds, "requests_per_s": len(requests) / seconds}
    tick()
    out["throughput_ratio"] = out["llamactor"]["requests_per_s"] / out["one_at_a_time"]["requests_per_s"]
    out["memory_ratio"] = out["memory"]["scoring_peak_rss_mib"] / out["memory"]["generating_peak_rss_mib"]
    out["generation_ratio"] = loaded / alone
    return out
