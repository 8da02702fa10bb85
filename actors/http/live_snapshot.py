"""The live view of the engine (``/ui/engine``, ``llamactor top``): one typed snapshot, a pure
function of what the trees already publish.

``engine_snapshot`` reads two readings of every replica's published stats (``StatsBoard``, as
``/health`` and ``/metrics`` read them) taken ``interval_s`` apart, and the batch jobs in
progress; it does no I/O and starts no thread, so it is tested without a model. Rates (tokens per
second, rows per step by kind, cache hits) come from the difference of the two readings' cumulative
counters; a batcher restart resets them, so a negative difference counts as none. The field names
are the stable names the page's ``data-metric`` attributes, its charts and scrapers use. The
tenants' shares (their running and waiting sequences) name every tenant: the stream that carries
them is for admin keys once keys exist (the middleware).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

ReplicaStats = Sequence[tuple[str, int, Mapping[str, Any]]]  # (model, replica, published stats)

# the cumulative counters a rate is taken of, and the gauges summed across replicas, by name
COUNTERS = ("steps", "tokens_generated", "prompt_tokens_computed", "prompt_rows_scored", "embedding_tokens",
            "embedding_steps", "step_sequences", "restarts")


class Figures(BaseModel):
    """What one replica, one model or the whole daemon is doing (rates over the last interval)."""

    running: int = 0  # sequences being decoded
    waiting: int = 0  # requests waiting for a sequence
    in_flight: int = 0  # requests the router has sent and not seen finish
    kv_used: int = 0  # KV cells in use (running sequences and cached prefixes)
    kv_cached: int = 0  # of those, the cells only cached prefixes hold (evictable)
    kv_free: int = 0
    kv_size: int = 0
    tokens_per_s: float = 0.0  # tokens generated per second
    prompt_tokens_per_s: float = 0.0  # prompt tokens computed per second
    kv_use: float = 0.0  # kv_used / kv_size
    steps: int = 0  # decode steps since the batcher started
    steps_per_s: float = 0.0
    batch_size: float = 0.0  # sequences per step
    rows_decode: float = 0.0  # rows per step, by kind: tokens generated
    rows_prefill: float = 0.0  # prompt tokens computed
    rows_scoring: float = 0.0  # prompt rows scored (logprobs of the prompt)
    rows_embedding: float = 0.0  # tokens per embedding step
    prefix_lookups: int = 0
    prefix_hits: int = 0
    prefix_hit_tokens: int = 0
    prefix_hits_per_s: float = 0.0
    prefix_hit_rate: float = 0.0  # hits / lookups over the interval (0 without a lookup)
    ram_entries: int = 0  # the prefix cache's host-RAM tier
    ram_bytes: int = 0
    ram_budget_bytes: int = 0
    disk_entries: int = 0  # its disk tier
    disk_bytes: int = 0
    disk_budget_bytes: int = 0
    restarts: int = 0  # batcher restarts by the supervisor


class ReplicaView(BaseModel):
    replica: int
    state: str
    figures: Figures


class ModelView(BaseModel):
    name: str
    state: str  # ready, starting, restarting, failed ... or unloaded
    figures: Figures
    replicas: list[ReplicaView]


class JobView(BaseModel):
    """A batch job that is not finished, with its progress."""

    id: str
    status: str
    endpoint: str
    total: int
    completed: int
    failed: int


class TenantView(BaseModel):
    """One tenant's share of the engine now: its sequences running and waiting, every model's."""

    name: str
    running: int
    waiting: int


class EngineSnapshot(BaseModel):
    interval_s: float  # between the two readings the rates are taken over (0: the first reading)
    figures: Figures  # the whole daemon
    models: list[ModelView]
    jobs: list[JobView]
    tenants: list[TenantView] = []  # those with a sequence running or waiting, by name


def readings(stats: Mapping[str, Any]) -> dict[str, float]:
    """One replica's published stats as flat numbers: gauges and cumulative counters."""
    cache = stats.get("prefix_cache") or {}
    ram = stats.get("cache_ram") or {}
    disk = ram.get("disk") or {}
    return {"running": stats.get("running") or 0, "waiting": stats.get("pending") or 0,
            "in_flight": stats.get("in_flight") or 0, "kv_used": stats.get("kv_used") or 0,
            "kv_cached": cache.get("cells") or 0, "kv_size": stats.get("kv_size") or 0,
            "prefix_lookups": cache.get("lookups") or 0, "prefix_hits": cache.get("hits") or 0,
            "prefix_hit_tokens": cache.get("hit_tokens") or 0,
            "ram_entries": ram.get("entries") or 0, "ram_bytes": ram.get("bytes") or 0,
            "ram_budget_bytes": ram.get("budget_bytes") or 0, "disk_entries": disk.get("entries") or 0,
            "disk_bytes": disk.get("bytes") or 0, "disk_budget_bytes": disk.get("budget_bytes") or 0,
            **{k: stats.get(k) or 0 for k in COUNTERS}}


def summed(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value
    return total


def figures(now: Mapping[str, float], before: Mapping[str, float] | None, interval_s: float) -> Figures:
    """``now``'s gauges, and its counters' rates since ``before`` (none on a first reading)."""
    def delta(key: str) -> float:
        return max(0.0, now.get(key, 0) - before.get(key, 0)) if before is not None else 0.0

    steps, embedding_steps, lookups = delta("steps"), delta("embedding_steps"), delta("prefix_lookups")
    per_s = 1 / interval_s if before is not None and interval_s > 0 else 0.0
    per_step = 1 / steps if steps else 0.0
    gauges: dict[str, Any] = {k: int(now.get(k, 0)) for k in Figures.model_fields if k in now}
    return Figures(**{**gauges, "kv_free": int(max(0, now.get("kv_size", 0) - now.get("kv_used", 0))),
                      "tokens_per_s": round(delta("tokens_generated") * per_s, 1),
                      "prompt_tokens_per_s": round(delta("prompt_tokens_computed") * per_s, 1),
                      "kv_use": round(now.get("kv_used", 0) / now["kv_size"], 4) if now.get("kv_size") else 0.0,
                      "prefix_hits_per_s": round(delta("prefix_hits") * per_s, 2),
                      "prefix_hit_rate": round(delta("prefix_hits") / lookups, 4) if lookups else 0.0,
                      "steps_per_s": round(steps * per_s, 1),
                      "batch_size": round(delta("step_sequences") * per_step, 2),
                      "rows_decode": round(delta("tokens_generated") * per_step, 2),
                      "rows_prefill": round(delta("prompt_tokens_computed") * per_step, 2),
                      "rows_scoring": round(delta("prompt_rows_scored") * per_step, 2),
                      "rows_embedding": round(delta("embedding_tokens") / embedding_steps, 2)
                      if embedding_steps else 0.0})


def job_view(batch: Mapping[str, Any]) -> JobView:
    counts = batch.get("request_counts") or {}
    return JobView(id=batch["id"], status=batch["status"], endpoint=batch.get("endpoint", ""),
                   total=counts.get("total", 0), completed=counts.get("completed", 0), failed=counts.get("failed", 0))


def tenant_views(now: ReplicaStats) -> list[TenantView]:
    """Every replica's running and waiting sequences by tenant (``stats["tenants"]``), summed."""
    counts: dict[str, list[int]] = {}
    for _, _, stats in now:
        for name, seqs in (stats.get("tenants") or {}).items():
            mine = counts.setdefault(name, [0, 0])
            mine[0] += seqs.get("running", 0)
            mine[1] += seqs.get("waiting", 0)
    return [TenantView(name=name, running=r, waiting=w) for name, (r, w) in sorted(counts.items())]


def model_state(states: set[str]) -> str:
    """A model's state from its replicas' (the worst first); ``unloaded`` with none."""
    if not states:
        return "unloaded"
    return "ready" if states == {"ready"} else sorted(states - {"ready"})[0]


def engine_snapshot(now: ReplicaStats, before: ReplicaStats | None, interval_s: float,
                    model_names: Sequence[str], batches: Sequence[Mapping[str, Any]] = ()) -> EngineSnapshot:
    """The snapshot of ``now``, with rates over ``interval_s`` since ``before`` (None: the first
    reading). ``model_names``: every model served, loaded or not; ``batches``: the Batch objects of
    the jobs in progress."""
    earlier = {(m, i): readings(s) for m, i, s in before} if before is not None else {}
    models, all_now, all_before = [], [], []
    for name in model_names:
        mine = [(i, s, readings(s)) for m, i, s in now if m == name]
        replicas = [ReplicaView(replica=i, state=str(s.get("state", "unknown")),
                                figures=figures(r, earlier.get((name, i)) if before is not None else None,
                                                interval_s)) for i, s, r in mine]
        model_now = summed([r for _, _, r in mine])
        model_before = summed([earlier.get((name, i), r) for i, _, r in mine]) if before is not None else None
        models.append(ModelView(name=name, state=model_state({str(s.get("state")) for _, s, _ in mine}),
                                figures=figures(model_now, model_before, interval_s), replicas=replicas))
        all_now.append(model_now)
        if model_before is not None:
            all_before.append(model_before)
    return EngineSnapshot(interval_s=round(interval_s, 3) if before is not None else 0.0,
                          figures=figures(summed(all_now), summed(all_before) if before is not None else None,
                                          interval_s),
                          models=models, jobs=[job_view(b) for b in batches], tenants=tenant_views(now))
