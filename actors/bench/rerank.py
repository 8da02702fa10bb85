"""The *rerank* workload of ``llamactor bench``: one rerank request's documents scored as one group
of label sequences on a shared judging prompt, against llama-cpp-python scoring the same prompts.

Legs, each against a baseline measured in the same run (docs/performance.md, "Rerank"):

* *one request*: 64 documents of ~60 tokens against one query, ``LLM.rerank`` once, vs
  ``Llama(logits_all=True)`` scoring the same 64 judging prompts (the same tokens: the handle's
  own judging prompt, ``rerank_quality.judging_prompts``) one at a time, each read as P(yes) / (P(yes) + P(no)).
  Each rerank asks another query, so no document's KV is cached from an earlier one; the judging
  prompt's examples are (a warm-up rerank), as in a server's steady state.
* *prefix sharing*: the same request on a tree with ``prefix_cache=False`` vs the default.
* *beside chat*: 8 generation streams alone vs while 8 callers keep reranking.
* *quality* (``rerank_quality``): top-1 on the labelled set and the scores against
  llama-cpp-python's on both bundled models.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llamactor
from llamactor.bench import baselines, rerank_quality
from llamactor.bench.measure import burst_beside_load, llamactor_burst, step_ms_cell
from llamactor.bench.prompts import TRADES, WORDS, uniform_prompts
from llamactor.bench.rerank_quality import judging_prompts
from llamactor.bench.settings import BenchSettings

QUERIES = ("Which trade turns clay into pots and bowls?", "Who makes barrels from wooden staves?",
           "Which craft colours cloth with plant dyes?", "Who bakes bread before the sun rises?",
           "Which worker builds walls from cut stone?", "Who makes candles from wax and tallow?",
           "Which trade turns hides into leather?", "Who fits arrows with feathers?",
           "Which craft blows molten glass into shapes?", "Who grinds grain into flour at the mill?")


@dataclass(frozen=True, slots=True)
class Sizes:
    """How large each leg is: documents per request, reranks timed, rerank callers and chat
    streams beside each other, tokens per chat stream, labelled cases per model (0: no quality leg)."""

    documents: int = 64
    repeats: int = 3
    callers: int = 8
    chat_streams: int = 8
    chat_tokens: int = 64
    quality_cases: int | None = None  # None: the whole labelled set


def sizes(s: BenchSettings) -> Sizes:
    return Sizes(documents=16, repeats=1, callers=0, quality_cases=0) if s.quick else Sizes()


def documents(n: int, seed: int = 39) -> list[str]:
    """``n`` documents of about 60 tokens: 45-55 words each, a trade named among common words."""
    rng = random.Random(seed)
    return [" ".join([rng.choice(TRADES)] + [rng.choice(WORDS) for _ in range(rng.randint(44, 54))]).capitalize() + "."
            for _ in range(n)]


def _timed_reranks(llm: llamactor.LLM, docs: list[str], repeats: int) -> dict[str, Any]:
    """The median seconds of ``repeats`` reranks, each with a query of its own, and the batcher's
    work over all of them (prompt tokens computed, steps, per-step ms)."""
    llm.rerank(QUERIES[-1], docs[:2])  # the judging prompt prepared, its examples cached
    before, seconds = llm.stats(), []
    for query in QUERIES[:repeats]:
        start = time.perf_counter()
        llm.rerank(query, docs)
        seconds.append(time.perf_counter() - start)
    after = llm.stats()
    return {"seconds": statistics.median(seconds), "documents_per_s": len(docs) / statistics.median(seconds),
            "prompt_tokens_computed": (after["prompt_tokens_computed"] - before["prompt_tokens_computed"]) // repeats,
            "label_rows": (after["label_rows"] - before["label_rows"]) // repeats,
            "steps": (after["steps"] - before["steps"]) / repeats,
            "step_ms": {k: round((v - before["step_ms"].get(k, 0.0)) / max(1, after["steps"] - before["steps"]), 2)
                        for k, v in after["step_ms"].items()}}


def _reranks_beside_chat(llm: llamactor.LLM, docs: list[str], z: Sizes) -> dict[str, Any]:
    """Chat tokens/s of ``chat_streams`` streams alone (before and after, averaged: a shared machine
    drifts), and while ``callers`` threads keep reranking; the chat prompts are cached by a short
    burst first, so that no leg pays for computing them and the others not."""
    prompts = uniform_prompts(z.chat_streams)
    llamactor_burst(llm, prompts, 2)
    before = llamactor_burst(llm, prompts, z.chat_tokens)["tokens_per_s"]
    beside, reranks = burst_beside_load(llm, z.chat_tokens, lambda i: llm.rerank(f"{QUERIES[i % len(QUERIES)]} ({i})",
                                                                                 docs), z.callers, z.chat_streams)
    after = llamactor_burst(llm, prompts, z.chat_tokens)["tokens_per_s"]
    return {"alone_tokens_per_s": (before + after) / 2, "beside_reranks_tokens_per_s": beside,
            "reranks_meanwhile": reranks}


def run_legs(model_path: str, z: Sizes, n_threads: int, tick: Callable[[], None], n_gpu_layers: int = 0) -> dict[str, Any]:
    """Every leg on ``model_path`` at sizes ``z``: the results dict the report reads."""
    docs = documents(z.documents)
    out: dict[str, Any] = {"documents": len(docs), "sizes": {"repeats": z.repeats, "callers": z.callers,
                                                            "chat_streams": z.chat_streams, "chat_tokens": z.chat_tokens}}
    common: dict[str, Any] = {"n_parallel": 16, "n_threads": n_threads, "n_ctx": 8192, "n_gpu_layers": n_gpu_layers}
    with llamactor.start(model_path, prefix_cache=False, **common) as llm:
        out["no_prefix_sharing"] = _timed_reranks(llm, docs, z.repeats)
    with llamactor.start(model_path, **common) as llm:
        out["llamactor"] = _timed_reranks(llm, docs, z.repeats)
        prompts, labels = judging_prompts(llm, QUERIES[0], docs)
        ours = [r.relevance_score for r in sorted(llm.rerank(QUERIES[0], docs).results, key=lambda r: r.index)]
        tick()
        if z.callers:
            out["beside_chat"] = _reranks_beside_chat(llm, docs, z)
    tick()
    seconds, theirs = baselines.label_scores_one_at_a_time(model_path, prompts, labels, n_threads)
    out["one_at_a_time"] = {"seconds": seconds, "documents_per_s": len(docs) / seconds,
                            "prompt_tokens": sum(len(p) for p in prompts)}
    out["mean_document_tokens"] = (sum(len(p) for p in prompts) - len(docs) * _shared_len(prompts)) / len(docs)
    out["max_score_diff_vs_one_at_a_time"] = max(abs(a - b) for a, b in zip(ours, theirs, strict=True))
    if z.quality_cases != 0:
        out["quality"] = rerank_quality.both_models(model_path, n_threads, z.quality_cases)
    tick()
    return {**out, **ratios(out)}


def _shared_len(prompts: list[list[int]]) -> int:
    """The tokens every prompt starts with (the judging context; the template's end is counted too)."""
    first, n = prompts[0], len(prompts[0])
    for p in prompts[1:]:
        n = next((i for i, (a, b) in enumerate(zip(first[:n], p)) if a != b), min(n, len(p)))
    return n


def ratios(out: dict[str, Any]) -> dict[str, float]:
    """The goals' figures from the legs' results (pure)."""
    r = {"throughput_ratio": out["llamactor"]["documents_per_s"] / out["one_at_a_time"]["documents_per_s"],
         "prefix_sharing_speedup": out["no_prefix_sharing"]["seconds"] / out["llamactor"]["seconds"],
         "prefix_sharing_tokens_ratio": out["llamactor"]["prompt_tokens_computed"]
         / max(1, out["no_prefix_sharing"]["prompt_tokens_computed"])}
    if chat := out.get("beside_chat"):
        r["chat_ratio"] = chat["beside_reranks_tokens_per_s"] / chat["alone_tokens_per_s"]
    if q := out.get("quality"):
        r.update(rerank_quality.summary(q))
    return r


def bench_rerank(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    return run_legs(s.model_path, sizes(s), s.n_threads, tick, s.n_gpu_layers)


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's lines: one request vs one prompt at a time, prefix sharing, chat beside, quality."""
    if not (rr := results.get("rerank")):
        return []
    ours, off, theirs = rr["llamactor"], rr["no_prefix_sharing"], rr["one_at_a_time"]
    lines = [f"Rerank: {rr['documents']} documents of {rr['mean_document_tokens']:.0f} tokens against one query, one "
             f"`LLM.rerank` (median of {rr['sizes']['repeats']}): {ours['seconds']:.2f} s, {ours['documents_per_s']:.1f} "
             f"documents/s ({ours['prompt_tokens_computed']} prompt tokens computed in {ours['steps']:.0f} steps; step ms "
             f"decode / sample / other {step_ms_cell(ours['step_ms'])}) vs {theirs['seconds']:.2f} s scoring the "
             f"{theirs['prompt_tokens']} tokens of the same judging prompts one at a time through "
             f"`Llama(logits_all=True)` ({rr['throughput_ratio']:.2f}×; scores at most "
             f"{rr['max_score_diff_vs_one_at_a_time']:.4f} apart). Prefix sharing off (`prefix_cache=False`): "
             f"{off['seconds']:.2f} s, {off['prompt_tokens_computed']} prompt tokens computed in {off['steps']:.0f} "
             f"steps ({rr['prefix_sharing_speedup']:.2f}× slower; on computes {rr['prefix_sharing_tokens_ratio']:.0%} "
             "of its tokens)."]
    if chat := rr.get("beside_chat"):
        z = rr["sizes"]
        lines.append(f"Rerank beside chat: {z['chat_streams']} streams × {z['chat_tokens']} tokens, "
                     f"{chat['alone_tokens_per_s']:.1f} tok/s alone, {chat['beside_reranks_tokens_per_s']:.1f} tok/s "
                     f"while {z['callers']} callers rerank {rr['documents']} documents each ({rr['chat_ratio']:.2f}×; "
                     f"{chat['reranks_meanwhile']} reranks meanwhile).")
    if q := rr.get("quality"):
        lines += rerank_quality.report_lines(q)
    return lines + [""]
