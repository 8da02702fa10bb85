"""Many threads share one model: each call to ask() is batched with the others."""

import concurrent.futures

import llamactor

QUESTIONS = [f"Write one sentence about the number {i}." for i in range(16)]

with llamactor.start(n_parallel=16) as llm:
    with concurrent.futures.ThreadPoolExecutor(len(QUESTIONS)) as pool:
        for c in pool.map(lambda q: llm.ask(q, max_tokens=48, temperature=0), QUESTIONS):
            print(f"[{c.usage.completion_tokens:3d} tokens, ttft {c.timings.ttft_ms:6.1f} ms] {c.text.strip()[:70]}")
    print(llm.stats())
