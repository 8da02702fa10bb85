"""What the batcher reports: its ``stats()`` snapshot, and the KV audit the tests ask for.

Both run on the batcher thread (``GetStats`` / ``AuditKv`` are asked of the actor).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from llamactor.native.engine import Engine
from llamactor.prefix_index import PrefixIndex

if TYPE_CHECKING:
    from llamactor.batcher import BatcherActor


def audit_kv(engine: Engine, index: PrefixIndex) -> list[str]:
    """Every sequence the index tracks holds positions 0 .. length - 1 in llama.cpp, sliding-window
    cells included (its shadow keeps them), and every other seq_id holds nothing."""
    problems = []
    for seq_id in range(engine.info.n_seq_max):
        length = index.length(seq_id) if seq_id in index.leaf else 0
        pos_min, pos_max = engine.seq_pos_min(seq_id), engine.seq_pos_max(seq_id)
        if pos_max != length - 1 or pos_min != (0 if length else -1):
            problems.append(f"seq {seq_id}: index holds {length} cells, llama.cpp positions {pos_min}..{pos_max}")
    return problems


def batcher_stats(b: BatcherActor) -> dict[str, Any]:
    s, info, index = b.scheduler, b.engine.info, b.index
    cache = index.stats()
    oldest = s.oldest_waiting_effective_priority(time.perf_counter())
    return {"generation": b.generation, "running": len(s.running), "pending": len(s.pending),
            "free_seq_ids": s.n_free, "n_parallel": b.config.n_parallel,
            "schedule_policy": s.policy.name, "preemptions": s.n_preemptions, "watchdog_trips": b.watchdog_trips,
            "pending_by_priority": {str(p): n for p, n in s.waiting_by_priority().items()},
            "oldest_waiting_priority": round(oldest, 3) if oldest is not None else None,
            "kv_used": index.cells_used, "kv_size": info.n_ctx,
            "kv_usage": round(index.cells_used / info.n_ctx, 4), **b.counters,
            "tokens_cached": cache["hit_tokens"],
            # entries may use every seq_id that running sequences and pinned prompts leave
            "prefix_cache": {**cache, "max_entries": info.n_seq_max - s.n_parallel - cache["pinned"]},
            **b.embeddings.queue.stats(), "embedding_retries": b.embeddings.n_retries,
            # constrained rows sampled, and those the grammar refused at first (drawn again masked)
            "grammar_rows": b.sampler.n_checked, "grammar_rows_masked": b.sampler.n_masked,
            "step_ms": {**{k: round(v, 3) for k, v in b.step_ms.items()}, "embed": round(b.embeddings.ms, 3)}}
