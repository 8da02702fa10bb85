"""The *embeddings* leg of ``llamactor bench``.

512 short texts (8-64 words) embedded by 16 concurrent callers, one text per call, so the
batcher packs inputs of different callers into each step; the yardstick is the same texts one
at a time through llama-cpp-python's ``Llama(embedding=True).embed``. Then generation under an
embedding load: a burst of 16 generations alone, and again while 16 callers keep embedding.
"""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.bench import baselines
from llamactor.bench.measure import burst_beside_load, llamactor_burst
from llamactor.bench.prompts import WORDS, uniform_prompts
from llamactor.bench.settings import BenchSettings


def _texts(n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 64))) for _ in range(n)]


def bench_embeddings(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    texts = _texts(128 if s.quick else 512)
    out: dict[str, Any] = {"texts": len(texts), "callers": 16}
    seconds, n_tokens = baselines.embed_one_at_a_time(s.model_path, texts, s.n_threads)
    out["one_at_a_time"] = {"seconds": seconds, "inputs_per_s": len(texts) / seconds, "tokens_per_s": n_tokens / seconds}
    tick()
    with llamactor.start(s.model_path, n_parallel=16, n_threads=s.n_threads, n_ctx=s.n_ctx) as llm:
        llm.embed(texts[0])
        before = llm.stats()
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(llm.embed, texts))
        seconds = time.perf_counter() - start
        after = llm.stats()
        tokens = sum(r.prompt_tokens for r in results)
        steps = after["embedding_steps"] - before["embedding_steps"]
        out["llamactor"] = {"seconds": seconds, "inputs_per_s": len(texts) / seconds, "tokens_per_s": tokens / seconds,
                            "steps": steps, "inputs_per_step": len(texts) / max(steps, 1),
                            "packing_efficiency": tokens / max(steps, 1) / llm.config.embedding_n_batch,
                            "ms_per_step": (after["step_ms"]["embed"] - before["step_ms"]["embed"]) / max(steps, 1)}
        tick()
        max_tokens = 32 if s.quick else 64
        alone = llamactor_burst(llm, uniform_prompts(16), max_tokens)["tokens_per_s"]
        loaded, embedded = burst_beside_load(llm, max_tokens, lambda i: llm.embed(texts[i % len(texts)]), 16)
        out["generation"] = {"alone_tokens_per_s": alone, "under_load_tokens_per_s": loaded,
                             "texts_embedded_meanwhile": embedded}
    tick()
    out["throughput_ratio"] = out["llamactor"]["inputs_per_s"] / out["one_at_a_time"]["inputs_per_s"]
    out["generation_ratio"] = loaded / alone
    return out


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's line: packed vs one-at-a-time embeddings, and generation beside an embedding load."""
    if not (em := results.get("embeddings")):
        return []
    ours, theirs, gen = em["llamactor"], em["one_at_a_time"], em["generation"]
    return [f"Embeddings: {em['texts']} texts of 8-64 words, from {em['callers']} concurrent callers one text per "
            f"call: {ours['inputs_per_s']:.1f} inputs/s, {ours['tokens_per_s']:.0f} tokens/s "
            f"({ours['steps']} steps of {ours['ms_per_step']:.0f} ms, {ours['inputs_per_step']:.1f} inputs and "
            f"{ours['packing_efficiency']:.0%} of n_batch per step) vs {theirs['inputs_per_s']:.1f} inputs/s, "
            f"{theirs['tokens_per_s']:.0f} tokens/s one at a time through Llama.embed "
            f"({em['throughput_ratio']:.2f}×). Generation of 16 × 64 tokens: {gen['alone_tokens_per_s']:.1f} "
            f"tok/s alone, {gen['under_load_tokens_per_s']:.1f} tok/s while 16 callers keep embedding "
            f"({em['generation_ratio']:.2f}×; {gen['texts_embedded_meanwhile']} texts embedded meanwhile).", ""]
