"""The *embeddings* leg of ``llamactor bench`` (seed 004).

512 short texts (8-64 words) embedded by 16 concurrent callers, one text per call, so the
batcher packs inputs of different callers into each step; the yardstick is the same texts one
at a time through llama-cpp-python's ``Llama(embedding=True).embed``. Then generation under an
embedding load: a burst of 16 generations alone, and again while 16 callers keep embedding.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.bench import baselines
from llamactor.bench.prompts import WORDS, uniform_prompts
from llamactor.bench.settings import BenchSettings


def _texts(n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 64))) for _ in range(n)]


def _generation_burst(llm: llamactor.LLM, max_tokens: int) -> float:
    start = time.perf_counter()
    futures = [llm.submit(p, max_tokens=max_tokens, temperature=0, ignore_eos=True) for p in uniform_prompts(16)]
    tokens = sum(f.result().usage.completion_tokens for f in futures)
    return tokens / (time.perf_counter() - start)


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
        alone = _generation_burst(llm, max_tokens)
        stop = threading.Event()

        def keep_embedding(i: int) -> int:
            n = 0
            while not stop.is_set():
                llm.embed(texts[(i * 31 + n) % len(texts)])
                n += 1
            return n
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            load = [pool.submit(keep_embedding, i) for i in range(16)]
            loaded = _generation_burst(llm, max_tokens)
            stop.set()
            embedded = sum(f.result() for f in load)
        out["generation"] = {"alone_tokens_per_s": alone, "under_load_tokens_per_s": loaded,
                             "texts_embedded_meanwhile": embedded}
    tick()
    out["throughput_ratio"] = out["llamactor"]["inputs_per_s"] / out["one_at_a_time"]["inputs_per_s"]
    out["generation_ratio"] = loaded / alone
    return out
