"""The kept cells' leg of ``llamactor bench``: what a cache full of idle prefixes costs the steps,
with the rent (``scheduling/cell_rent.py``) on and off, in the same run.

A burst of one-off prompts (distinct ~400-token notes, 4 callers, 4 new tokens each) fills the
context's 8,192 cells with cached prefixes that never come back; then a lone stream and 8 streams
decode (greedy, 64 new tokens each). Without the rent the cells stay full, and llama.cpp attends
over all of them in every row of every step; with it, idle entries leave the cells (saved to the
RAM tier where that pays) once they have cost the steps more than keeping them saves. Interleaved
repeats, fresh trees, on both installed models; the streams' ratios are of medians, the burst's of
the legs' total times (docs/performance.md, *Kept cells pay rent*).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.base.models import instruct_model_path
from llamactor.bench.measure import median_ratio
from llamactor.bench.settings import BenchSettings

N_STREAMS = 8
NEW_TOKENS = 64


def _notes(n: int) -> list[str]:
    """One-off prompts of ~400 tokens that share only their opening."""
    return [f"Note {i}: " + " ".join(f"entry{i * 997 + k}" for k in range(130)) for i in range(n)]


def _decode_tok_s(llm: llamactor.LLM, n: int) -> float:
    """Greedy streams of ``NEW_TOKENS`` from ``n`` callers at once: their new tokens a second."""
    prompts = [f"Tell me story {i} about a lighthouse keeper." for i in range(n)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(lambda p: llm.ask(p, max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True), prompts))
    return sum(a.usage.completion_tokens for a in answers) / (time.perf_counter() - start)


def _leg(model_path: str, s: BenchSettings, rent: bool, n_notes: int) -> dict[str, Any]:
    with llamactor.start(model_path, n_parallel=N_STREAMS, n_ctx=8192, n_threads=s.n_threads,
                         n_gpu_layers=s.n_gpu_layers, prefix_cache_rent=rent) as llm:
        llm.ask("warm up", max_tokens=2)
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda p: llm.ask(p, max_tokens=4, temperature=0), _notes(n_notes)))
        burst_s = time.perf_counter() - start
        after_burst = llm.stats()
        lone = [_decode_tok_s(llm, 1) for _ in range(2)]
        streams = _decode_tok_s(llm, N_STREAMS)
        stats = llm.stats()
    # the cells kept, and one past the highest cell in use: what every step attends over
    return {"burst_s": burst_s, "cells_after_burst": after_burst["prefix_cache"]["cells"],
            "top_after_burst": after_burst["kv_layout"]["top"], "lone_tok_s": lone, "streams_tok_s": streams,
            "cells_after": stats["prefix_cache"]["cells"], "top_after": stats["kv_layout"]["top"],
            "rent": stats["cache_ram"].get("rent"), "saved": stats["cache_ram"]["saved"]}


def _model(model_path: str, s: BenchSettings, n_notes: int, repeats: int) -> dict[str, Any]:
    """Rent on and off on one model, alternated ``repeats`` times; the on / off ratios."""
    legs: dict[str, list[dict[str, Any]]] = {"rent_on": [], "rent_off": []}
    for _ in range(repeats):
        for rent in (True, False):
            legs["rent_on" if rent else "rent_off"].append(_leg(model_path, s, rent, n_notes))

    def ratio(metric: Callable[[dict[str, Any]], float]) -> float:
        return median_ratio([metric(leg) for leg in legs["rent_on"]], [metric(leg) for leg in legs["rent_off"]])

    # the burst's prompts a second over all its legs, on / off: one leg of a few minutes spreads more
    # than the rent moves it (SmolLM2's ran 182 and 253 s with it, 210 and 220 without), and the
    # lower median of two picks the slower leg; the total time weighs every leg alike
    burst_s = {side: sum(leg["burst_s"] for leg in legs[side]) for side in legs}
    return {**legs, "burst_ratio": burst_s["rent_off"] / burst_s["rent_on"],
            "lone_ratio": ratio(lambda leg: leg["lone_tok_s"][-1]),  # the second lone stream: the rent settled
            "streams_ratio": ratio(lambda leg: leg["streams_tok_s"])}


def bench_kept_cells(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    """Both installed models (SmolLM2's 30 layers all attend over the whole cache; Gemma 3's cost
    less a cell), their lower ratios as the goals'."""
    n_notes, repeats = (24, 1) if s.quick else (48, 2)
    out: dict[str, Any] = {"notes": n_notes, "repeats": repeats}
    for name, path in {"bench": s.model_path, "instruct": instruct_model_path()}.items():
        out[name] = _model(path, s, n_notes, repeats)
        tick()
    for metric in ("burst_ratio", "lone_ratio", "streams_ratio"):
        out[f"min_{metric}"] = min(out["bench"][metric], out["instruct"][metric])
    return out


def report_lines(results: dict[str, Any]) -> list[str]:
    if not (kc := results.get("kept_cells")):
        return []
    lines = [f"Kept cells: {kc['notes']} one-off ~400-token prompts fill 8,192 cells, then a lone stream and "
             f"{N_STREAMS} streams ({NEW_TOKENS} new tokens each), rent on / off, {kc['repeats']} repeat(s):", ""]
    for name in ("bench", "instruct"):
        m = kc[name]
        on, off = m["rent_on"][-1], m["rent_off"][-1]
        lines += [f"- {name}: burst {m['burst_ratio']:.2f}× prompts/s, lone stream {m['lone_ratio']:.2f}× tok/s, "
                  f"{N_STREAMS} streams {m['streams_ratio']:.2f}× tok/s. Last repeat: cells in use after the burst "
                  f"{on['cells_after_burst']} vs {off['cells_after_burst']} (top cell {on['top_after_burst']} vs "
                  f"{off['top_after_burst']}), after the streams {on['cells_after']} vs {off['cells_after']} (top "
                  f"{on['top_after']} vs {off['top_after']}); lone {on['lone_tok_s'][-1]:.1f} vs {off['lone_tok_s'][-1]:.1f} tok/s, "
                  f"{N_STREAMS} streams {on['streams_tok_s']:.1f} vs {off['streams_tok_s']:.1f}; rent {on['rent']}."]
    return lines + [""]
