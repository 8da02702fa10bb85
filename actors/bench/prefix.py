"""The prefix-cache legs of ``llamactor bench``: multi-turn chat and few-shot prompts, cache on vs off.

*multiturn*: U users, each with its own ~300-token persona, hold T-turn conversations through
``LLM.chat`` (the whole history re-sent every turn, 32 new tokens a turn, greedy), all users at
once. *few-shot*: 16 requests sharing a ~1,000-token prefix of worked examples, distinct questions.
Each runs on a tree with the prefix cache and one without, in the same run. ``report_lines``
renders both in the report.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.bench.conversations import conversation
from llamactor.bench.measure import percentile, step_ms_cell
from llamactor.bench.prompts import TOWNS, TRADES
from llamactor.bench.settings import BenchSettings


def multiturn_run(llm: llamactor.LLM, n_users: int, n_turns: int, max_tokens: int) -> dict[str, Any]:
    before = llm.stats()
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n_users) as pool:
        turns = [t for conv in pool.map(lambda u: conversation(llm, u, n_turns, max_tokens), range(n_users))
                 for t in conv]
    wall = time.perf_counter() - start
    after = llm.stats()
    first, later = [t.ttft_ms for t in turns if t.turn == 0], [t.ttft_ms for t in turns if t.turn > 0]
    sent = sum(t.prompt_tokens for t in turns)
    computed = sum(t.prompt_tokens - t.cached_tokens for t in turns)
    new = sum(t.prompt_tokens - t.history_tokens for t in turns)  # what no earlier turn had seen
    history = sum(t.history_tokens for t in turns)
    steps = max(after["steps"] - before["steps"], 1)
    return {"wall_s": wall, "ttft_turn1_p50_ms": percentile(first, 50), "ttft_turn1_p90_ms": percentile(first, 90),
            "ttft_later_p50_ms": percentile(later, 50), "ttft_later_p90_ms": percentile(later, 90),
            "prompt_tokens_sent": sent, "prompt_tokens_computed": computed, "prompt_tokens_new": new,
            "history_tokens": history,
            "history_from_cache": sum(min(t.cached_tokens, t.history_tokens) for t in turns) / max(history, 1),
            "evicted_cells": after["prefix_cache"]["evicted_cells"] - before["prefix_cache"]["evicted_cells"],
            "step_ms": {k: round((after["step_ms"][k] - before["step_ms"][k]) / steps, 3) for k in after["step_ms"]}}


def multiturn_shapes(s: BenchSettings) -> list[tuple[int, int, int, int]]:
    """(users, turns, sequences, n_ctx) of each row; the second (more users than sequences) only in
    the default and full runs. Two progress ticks a row (cache on, off)."""
    return [(4, 3, 4, 8192)] if s.quick else [(8, 6, 8, 8192), (32, 4, 8, 32768)]


def bench_multiturn(s: BenchSettings, tick: Callable[[], None]) -> list[dict[str, Any]]:
    rows = []
    for n_users, n_turns, n_parallel, n_ctx in multiturn_shapes(s):
        row: dict[str, Any] = {"users": n_users, "turns": n_turns, "n_parallel": n_parallel, "n_ctx": n_ctx}
        for cache in (True, False):
            with llamactor.start(s.model_path, n_parallel=n_parallel, n_ctx=n_ctx, n_threads=s.n_threads,
                                 prefix_cache=cache) as llm:
                llm.ask("warm up", max_tokens=2)
                row["cache_on" if cache else "cache_off"] = multiturn_run(llm, n_users, n_turns, 32)
            tick()
        on, off = row["cache_on"], row["cache_off"]
        row["ttft_later_p50_ratio"] = on["ttft_later_p50_ms"] / off["ttft_later_p50_ms"]
        row["wall_ratio"] = on["wall_s"] / off["wall_s"]
        row["computed_vs_new"] = on["prompt_tokens_computed"] / on["prompt_tokens_new"]
        rows.append(row)
    return rows


def few_shot_prefix(n_examples: int) -> str:
    examples = "\n".join(f"Q: A {TRADES[k % 16]} in {TOWNS[(3 * k) % 16]} has {k + 4} crates of {k + 2} jars each. "
                         f"How many jars?\nA: {k + 4} times {k + 2} is {(k + 4) * (k + 2)}, so {(k + 4) * (k + 2)} jars."
                         for k in range(n_examples))
    return f"Answer each question like the worked examples.\n{examples}\n"


def bench_few_shot(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    n, prefix = (8, few_shot_prefix(12)) if s.quick else (16, few_shot_prefix(24))
    prompts = [f"{prefix}Q: A {TRADES[i]} in {TOWNS[i]} has {i + 3} crates of {i + 5} jars each. How many jars?\nA:"
               for i in range(n)]
    # Without the cache all 16 prompts must fit in KV at once: 16 x 1,000 cells.
    out: dict[str, Any] = {"requests": n, "n_ctx": 32768}
    for cache in (True, False):
        with llamactor.start(s.model_path, n_parallel=16, n_threads=s.n_threads, n_ctx=out["n_ctx"],
                             prefix_cache=cache) as llm:
            llm.ask("warm up", max_tokens=2)
            before = llm.stats()
            start = time.perf_counter()
            futures = [llm.submit(p, max_tokens=16, temperature=0) for p in prompts]
            done = [f.result() for f in futures]
            wall = time.perf_counter() - start
            after = llm.stats()
        ttfts = [c.timings.ttft_ms for c in done]
        if cache:  # what the requests attached instead of computing: the shared examples
            out["shared_prefix_tokens"] = max(c.usage.cached_tokens for c in done)
        out["cache_on" if cache else "cache_off"] = {
            "wall_s": wall, "ttft_p50_ms": percentile(ttfts, 50), "ttft_p90_ms": percentile(ttfts, 90),
            "prompt_tokens_sent": sum(c.usage.prompt_tokens for c in done),
            "prompt_tokens_computed": after["prompt_tokens_computed"] - before["prompt_tokens_computed"]}
        tick()
    out["ttft_p50_ratio"] = out["cache_on"]["ttft_p50_ms"] / out["cache_off"]["ttft_p50_ms"]
    out["wall_ratio"] = out["cache_on"]["wall_s"] / out["cache_off"]["wall_s"]
    return out


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's section: the multiturn table (cache on and off per shape), then the few-shot line."""
    return _multiturn_lines(results.get("multiturn")) + _few_shot_lines(results.get("few_shot"))


def _multiturn_lines(rows: list[dict[str, Any]] | None) -> list[str]:
    if rows is None:
        return []
    lines = ["Multi-turn chat: U users at once, each its own ~300-token persona, the history re-sent every turn "
             "through `LLM.chat`, 32 new tokens a turn, greedy; prefix cache on vs off.", "",
             "| users × turns (sequences, n_ctx) | cache | wall s | TTFT p50/p90 turn 1 ms | TTFT p50/p90 later ms "
             "| prompt tokens sent / computed / new | history from cache | step ms: decode / sample / other |",
             "|---|---|---:|---|---|---|---:|---|"]
    for r in rows:
        for key in ("cache_on", "cache_off"):
            m = r[key]
            lines.append(f"| {r['users']} × {r['turns']} ({r['n_parallel']}, {r['n_ctx']}) | {key[6:]} | "
                         f"{m['wall_s']:.1f} | {m['ttft_turn1_p50_ms']:.0f} / {m['ttft_turn1_p90_ms']:.0f} | "
                         f"{m['ttft_later_p50_ms']:.0f} / {m['ttft_later_p90_ms']:.0f} | {m['prompt_tokens_sent']} / "
                         f"{m['prompt_tokens_computed']} / {m['prompt_tokens_new']} | {m['history_from_cache']:.1%} | "
                         f"{step_ms_cell(m['step_ms'])} |")
    return lines + [""]


def _few_shot_lines(fs: dict[str, Any] | None) -> list[str]:
    if not fs:
        return []
    on, off = fs["cache_on"], fs["cache_off"]
    return [f"Few-shot: {fs['requests']} requests at once sharing a {fs['shared_prefix_tokens']}-token prefix, distinct "
            f"questions: TTFT p50 {on['ttft_p50_ms']:.0f} ms with the cache vs {off['ttft_p50_ms']:.0f} ms without "
            f"({fs['ttft_p50_ratio']:.2f}×), wall {on['wall_s']:.1f} vs {off['wall_s']:.1f} s ({fs['wall_ratio']:.2f}×), "
            f"prompt tokens computed {on['prompt_tokens_computed']} vs {off['prompt_tokens_computed']} "
            f"(of {on['prompt_tokens_sent']} sent).", ""]
