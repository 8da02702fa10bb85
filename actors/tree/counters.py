"""What the batcher counts and reports: ``StepCounters``, the ``batcher_stats`` snapshot, and the
KV audit the tests ask for.

Everything here runs on the batcher thread; the snapshot is built from the pieces the batcher
owns (scheduler, prefix index, embedding steps, grammar sampler), passed in explicitly.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, TypeVarTuple

from llamactor.tree.embedding_steps import EmbeddingSteps
from llamactor.tree.grammar_sampler import GrammarSampler
from llamactor.base.engine_info import EngineInfo
from llamactor.native.devices import recent_devices
from llamactor.native.engine import Engine
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Sequence


T = TypeVar("T")
Ts = TypeVarTuple("Ts")


@dataclass(slots=True)
class StepCounters:
    """Cumulative counts since the batcher started, and per-phase milliseconds (the benchmark's
    per-step profile, ``profile``)."""

    counts: dict[str, int] = field(default_factory=lambda: {
        "steps": 0, "tokens_generated": 0, "prompt_tokens_computed": 0, "tokens_recomputed": 0,
        "requests_finished": 0, "step_sequences": 0,
        "prompt_rows_scored": 0, "label_rows": 0, "tokens_sampled_in_graph": 0,
        # chains attached to or detached from an id (each a re-plan of llama.cpp's graph), and
        # parked chains a request took over instead (docs/operations.md, *Sampling inside the graph*)
        "graph_chain_changes": 0, "graph_chains_adopted": 0,
        # tokens drafters proposed (verified or not: the budget grants what pays), draft rows
        # verified, and those taken as tokens or not (docs/architecture.md, *Speculation*)
        "proposed_draft_tokens": 0, "draft_tokens": 0, "accepted_draft_tokens": 0, "rejected_draft_tokens": 0,
        "rows_dropped": 0,  # overlapped steps' rows of sequences that ended while they were in flight
        "steps_planned_ahead": 0})  # overlapped steps launched as laid out while the step before computed
    # As timed: a generation step's four verbs, and the two parts of them the profile shows apart
    # (``sample``: within ``run``; ``score``: within ``postprocess``).
    phase_ms: dict[str, float] = field(default_factory=lambda: {
        "schedule": 0.0, "enact": 0.0, "run": 0.0, "sample": 0.0, "score": 0.0, "postprocess": 0.0})

    def timed(self, phase: str, verb: Callable[[*Ts], T], *args: *Ts) -> T:
        """``verb(*args)``, its time added to ``phase`` (batcher thread): the one place a step is timed."""
        start = time.perf_counter()
        out = verb(*args)
        self.phase_ms[phase] += (time.perf_counter() - start) * 1000
        return out

    def profile(self, mask_ms: float) -> dict[str, float]:
        """The per-step profile ``stats()["step_ms"]`` publishes: ``decode`` is ``llama_decode``
        with building its batch; ``mask`` the grammar sampler's full masks (``mask_ms``, its
        cumulative count) and ``sample`` the rest of the draw; ``postprocess`` all the host work
        after the decode (the draw and the scoring included, as the benchmark's host split reads it)."""
        ms = self.phase_ms
        return {"schedule": ms["schedule"], "enact": ms["enact"], "decode": ms["run"] - ms["sample"],
                "mask": mask_ms, "sample": ms["sample"] - mask_ms, "score": ms["score"],
                "postprocess": ms["postprocess"] + ms["sample"]}


def audit_kv(engine: Engine, index: PrefixIndex) -> list[str]:
    """Every sequence the index tracks holds positions 0 .. length - 1 in llama.cpp, sliding-window
    cells included (its shadow keeps them), and every other seq_id holds nothing; and so in the
    engine's mirror of the cells (``CellMap``), one cell a position."""
    problems = []
    for seq_id in range(engine.info.n_seq_max):
        length = index.length(seq_id) if seq_id in index.leaf else 0
        pos_min, pos_max = engine.seq_pos_min(seq_id), engine.seq_pos_max(seq_id)
        if pos_max != length - 1 or pos_min != (0 if length else -1):
            problems.append(f"seq {seq_id}: index holds {length} cells, llama.cpp positions {pos_min}..{pos_max}")
        mapped = engine.cells.order(seq_id)
        if sorted(mapped.tolist()) != list(range(length)):
            problems.append(f"seq {seq_id}: index holds {length} cells, the cell map {len(mapped)}")
    return problems


def sequences_by_tenant(running: Iterable[Sequence], pending: Iterable[Sequence]) -> dict[str, dict[str, int]]:
    """Each tenant's sequences running and waiting: its share of the engine, as the live view
    shows it (tenants' names: ``/engine/events`` is for admin keys, ``/health`` leaves it out)."""
    shares: dict[str, dict[str, int]] = {}
    for kind, seqs in (("running", running), ("waiting", pending)):
        for seq in seqs:
            shares.setdefault(seq.tenant, {"running": 0, "waiting": 0})[kind] += 1
    return shares


def batcher_stats(*, generation: int, watchdog_trips: int, counters: StepCounters, scheduler: Scheduler,
                  index: PrefixIndex, info: EngineInfo, embeddings: EmbeddingSteps,
                  sampler: GrammarSampler) -> dict[str, Any]:
    s = scheduler
    cache = index.stats()
    oldest = s.oldest_waiting_effective_priority(time.perf_counter())
    return {"generation": generation, "running": len(s.running), "pending": len(s.pending),
            "free_seq_ids": s.n_free, "n_parallel": s.n_parallel,
            "adapter_sets_running": s.turns.running_sets(s.running), "adapter_switches": s.turns.switches,
            "schedule_policy": s.policy.name, "batch_invariant": info.batch_invariant, "preemptions": s.n_preemptions,
            "kv_flushes": s.n_flushes, "watchdog_trips": watchdog_trips,
            "pending_by_priority": {str(p): n for p, n in s.waiting_by_priority().items()},
            "oldest_waiting_priority": round(oldest, 3) if oldest is not None else None,
            "tenants": sequences_by_tenant(s.running, s.pending), "kv_used": index.cells_used, "kv_size": info.n_ctx,
            "kv_usage": round(index.cells_used / info.n_ctx, 4), **counters.counts,
            "tokens_cached": cache["hit_tokens"], "prompt_rows_from_cache": s.score_cache.hits,
            # entries may use every seq_id that running sequences and pinned prompts leave
            "prefix_cache": {**cache, "max_entries": info.n_seq_max - s.n_parallel - cache["pinned"]},
            **embeddings.queue.stats(), "embedding_retries": embeddings.n_retries,
            # constrained rows sampled, and those the grammar refused at first (drawn again masked)
            "grammar_rows": sampler.n_checked, "grammar_rows_masked": sampler.n_masked,
            "step_ms": {**{k: round(v, 3) for k, v in counters.profile(sampler.mask_ms).items()},
                        "embed": round(embeddings.ms, 3)},
            # the build's backend devices and their free memory now (read at most once a second)
            "devices": [dataclasses.asdict(d) for d in recent_devices()]}
