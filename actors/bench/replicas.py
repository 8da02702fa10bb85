"""The *replicas* leg of ``llamactor bench``: several trees of one model behind a ``Router``.

*throughput*: 16 concurrent uniform requests on 2 replicas × 8 sequences (1 thread each) vs one
tree of 16 sequences (2 threads): the same cores in total. On 2 cores the replicas only share
them, so this shows the router's cost, not a gain (a gain needs a replica per socket or GPU).
*multiturn*: 9 users' conversations (history re-sent each turn) over 2 replicas under
``prefix_affinity`` vs ``shortest_queue``: the share of history tokens served from a replica's
prefix cache, and the later turns' TTFT. ``report_lines`` renders both in the report.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.bench.conversations import conversation
from llamactor.bench.measure import llamactor_burst, median_runs, percentile
from llamactor.bench.prompts import uniform_prompts
from llamactor.bench.settings import BenchSettings


def _router(s: BenchSettings, policy: str, replicas: int, n_parallel: int) -> llamactor.Router:
    threads = max(1, s.n_threads // replicas)
    return llamactor.start(models=[{"name": "bench", "path": s.model_path, "replicas": replicas, "policy": policy,
                                    "n_parallel": n_parallel, "n_threads": threads, "n_ctx": s.n_ctx}])


def _multiturn(model: llamactor.Replicas, n_users: int, n_turns: int) -> dict[str, Any]:
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n_users) as pool:
        turns = [t for conv in pool.map(lambda u: conversation(model, u, n_turns, 32), range(n_users)) for t in conv]
    wall = time.perf_counter() - start
    later = [t.ttft_ms for t in turns if t.turn > 0]
    history = sum(t.history_tokens for t in turns)
    return {"wall_s": wall, "ttft_later_p50_ms": percentile(later, 50), "ttft_later_p90_ms": percentile(later, 90),
            "history_from_cache": sum(min(t.cached_tokens, t.history_tokens) for t in turns) / max(history, 1),
            "served": list(model.served)}


def bench_replicas(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    prompts, mt = uniform_prompts(16), s.max_tokens
    with _router(s, "shortest_queue", 2, 8) as two, llamactor.start(
            s.model_path, n_parallel=16, n_threads=s.n_threads, n_ctx=s.n_ctx) as one:
        two["bench"].ask("warm up", max_tokens=2)
        one.ask("warm up", max_tokens=2)
        m = median_runs({"two_replicas": lambda: llamactor_burst(two["bench"], prompts, mt),
                         "one_tree": lambda: llamactor_burst(one, prompts, mt)}, s.repeats)
    tick()
    out: dict[str, Any] = {"throughput": {**m, "ratio": m["two_replicas"]["tokens_per_s"] / m["one_tree"]["tokens_per_s"]}}
    # An odd number of users: in lockstep rounds, the rotation among equal loads then sends a
    # user's turns to alternating replicas, as arrivals at random times would (an even number
    # would pin each user to one replica by accident).
    n_users, n_turns = (5, 3) if s.quick else (9, 4)
    out["multiturn"] = {"users": n_users, "turns": n_turns}
    for policy in ("prefix_affinity", "shortest_queue"):
        with _router(s, policy, 2, 4) as router:
            router["bench"].ask("warm up", max_tokens=2)
            out["multiturn"][policy] = _multiturn(router["bench"], n_users, n_turns)
        tick()
    mt_out = out["multiturn"]
    mt_out["hit_rate_gain"] = (mt_out["prefix_affinity"]["history_from_cache"]
                               - mt_out["shortest_queue"]["history_from_cache"])
    mt_out["ttft_later_p50_ratio"] = (mt_out["prefix_affinity"]["ttft_later_p50_ms"]
                                      / mt_out["shortest_queue"]["ttft_later_p50_ms"])
    return out


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's line: throughput on 2 replicas vs one tree, and the two routing policies' cache use."""
    if not (rp := results.get("replicas")):
        return []
    t, mt = rp["throughput"], rp["multiturn"]
    pa, sq = mt["prefix_affinity"], mt["shortest_queue"]
    return [f"Replicas: 16 concurrent uniform requests on 2 replicas × 8 sequences (1 thread each) "
            f"{t['two_replicas']['tokens_per_s']:.1f} tok/s vs one tree × 16 (2 threads) "
            f"{t['one_tree']['tokens_per_s']:.1f} tok/s ({t['ratio']:.2f}×; TTFT p50 "
            f"{t['two_replicas']['ttft_p50_ms']:.0f} vs {t['one_tree']['ttft_p50_ms']:.0f} ms). "
            f"{mt['users']} users × {mt['turns']} turns on 2 replicas: prefix_affinity "
            f"{pa['history_from_cache']:.0%} of history from cache, later-turn TTFT p50 "
            f"{pa['ttft_later_p50_ms']:.0f} ms, wall {pa['wall_s']:.1f} s; shortest_queue "
            f"{sq['history_from_cache']:.0%}, {sq['ttft_later_p50_ms']:.0f} ms, {sq['wall_s']:.1f} s.", ""]
