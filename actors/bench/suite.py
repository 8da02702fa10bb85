"""``llamactor bench``: the registry of workloads and the runner (``report`` imports their sections).

Everything runs in one process, one after the other, on the same model and thread count, so the
ratios compare like with like. Workloads, by their results key: *uniform*,
*shared_prefix*, *arrivals* and *single* (``generation``: against the sequential baseline and the
batched-decode ceiling, and the idle CPU use of a started tree), the daemon (``daemon``), the
prefix cache's *multiturn* and *few_shot* (``prefix``), the scheduler's *priorities* and
*overcommit* (``scheduling``), JSON-Schema-constrained vs unconstrained requests (``structured``),
packed embeddings (``embeddings``), lm-eval-style prompt scoring (``scoring``), one rerank request's documents on a
shared judging prompt and their quality on both models (``rerank``), two replicas behind the
router (``replicas``), durable batch jobs (``batch``: ``batch_jobs``), 16 streams across 3 batcher
crashes (``resilience``), a q8_0 KV cache and the daemon's resident memory (``memory``), the cache
tiers' *many_users* and *warm_restart* (``tiers``), a cache full of idle prefixes with the kept cells' rent
on and off (``kept_cells``), fair shares between tenants (``tenants``), the
throughput and memory legs on both installed models (``models``: ``two_models``), the
batcher's host work per step with real and replayed decodes (``host``), the token rate the host
side carries in-process and over HTTP on the replayed decode (``host_cap``), a mixed base/LoRA-adapter
load vs the base model alone (``adapters``), uniform and scoring at 8 streams in batch-invariant mode
vs the default, each in its own process (``batch_invariant``), drafted tokens (a prediction, n-gram
lookup) vs none on both models (``speculation``), and with a llama-server
binary the *peer* leg (``peer``) and N concurrent callers against it with and without backend
sampling (``streams``). The shared pieces live beside them: ``settings``
(``BenchSettings``, re-exported here for the CLI), ``measure``, ``prompts``, ``conversations``,
``servers``, ``baselines``, ``replay``; ``report`` turns the results into the report, each workload
module rendering its own section.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from llamactor.bench import (
    adapters,
    batch_invariant,
    batch_jobs,
    daemon,
    embeddings,
    generation,
    host,
    host_cap,
    kept_cells,
    memory,
    peer,
    prefix,
    replicas,
    rerank,
    resilience,
    scheduling,
    scoring,
    speculation,
    sim_device,
    streams,
    structured,
    tenants,
    tiers,
    two_models,
)
from llamactor.bench.settings import BenchSettings

__all__ = ["QUICK", "BenchSettings", "Workload", "failures", "n_ticks", "run", "selected", "workloads"]

Workload = Callable[[BenchSettings, Callable[[], None]], Any]

# The smoke run (``--quick`` without ``--only``: docs/performance.md, "Quick, default and full runs"):
# a few workloads, one per part of the system, whose goals are ratios against a baseline measured
# in the same run; the rest run in the default and full runs (and at their quick sizes with --only).
QUICK = ("uniform", "single", "multiturn", "structured", "rerank")


def workloads(s: BenchSettings) -> dict[str, tuple[int, Workload]]:
    """Every workload by its results key: (progress ticks, function)."""
    found: dict[str, tuple[int, Workload]] = {
        "uniform": (len(s.concurrencies), generation.bench_uniform),
        "shared_prefix": (1, generation.bench_shared_prefix),
        "arrivals": (1, generation.bench_arrivals), "single": (1, generation.bench_single),
        "sampled": (1, generation.bench_sampled),
        "daemon": (len(daemon.daemon_concurrencies(s)), daemon.bench_daemon),  # also fills results["daemon_idle"]
        "multiturn": (2 * len(prefix.multiturn_shapes(s)), prefix.bench_multiturn), "few_shot": (2, prefix.bench_few_shot),
        "priorities": (2, scheduling.bench_priorities), "overcommit": (2, scheduling.bench_overcommit),
        "structured": (1, structured.bench_structured), "embeddings": (3, embeddings.bench_embeddings),
        "replicas": (3, replicas.bench_replicas), "scoring": (3, scoring.bench_scoring),
        "rerank": (3, rerank.bench_rerank),
        "batch": (3, batch_jobs.bench_batch),
        "crash_streams": (2, resilience.bench_crash_streams), "kv_q8": (2, memory.bench_kv_q8),
        "memory": (3, memory.bench_memory),
        "many_users": (2, tiers.bench_many_users), "warm_restart": (3, tiers.bench_warm_restart),
        "one_off": (2 if s.quick else 3, tiers.bench_one_off),
        "kept_cells": (2, kept_cells.bench_kept_cells),
        "tenants": (tenants.n_ticks(s), tenants.bench_tenants), "host": (host.n_ticks(), host.bench_host),
        "host_cap": (host_cap.n_ticks(), host_cap.bench_host_cap),
        "sim_device": (sim_device.n_ticks(), sim_device.bench_sim_device),
        "adapters": (adapters.n_ticks(s), adapters.bench_adapters),
        "models": (two_models.N_TICKS, two_models.bench_models),
        "batch_invariant": (1 if s.quick else 3, batch_invariant.bench_batch_invariant),
        "speculation": (speculation.n_ticks(s), speculation.bench_speculation)}
    if s.peer_server:
        found["peer"] = (2, peer.bench_peer)
        found["streams"] = (len(streams.SERVERS), streams.bench_streams)
    return found


def selected(s: BenchSettings, only: list[str] | None = None) -> list[str]:
    """The workloads a run measures, in the registry's order: those named in ``only``, else the
    smoke set in a quick run, else every one."""
    names = only if only is not None else (QUICK if s.quick else None)
    return [name for name in workloads(s) if names is None or name in names]


def run(s: BenchSettings, tick: Callable[[], None], only: list[str] | None = None) -> dict[str, Any]:
    """Run the selected workloads, timing each (``s.seconds``); one that fails is recorded as
    ``{"error": ...}`` and the others go on."""
    registry = workloads(s)
    for name in selected(s, only):
        start = time.perf_counter()
        try:
            s.results[name] = registry[name][1](s, tick)
        except Exception as e:  # noqa: BLE001 - reported in the results, and by the exit code
            s.results[name] = {"error": f"{type(e).__name__}: {e}"}
        s.seconds[name] = round(time.perf_counter() - start, 1)
    return s.results


def failures(results: dict[str, Any]) -> dict[str, str]:
    """The failed workloads' errors, by name."""
    return {name: r["error"] for name, r in results.items() if isinstance(r, dict) and "error" in r}


def n_ticks(s: BenchSettings, only: list[str] | None = None) -> int:
    """The progress ticks of the selected workloads."""
    registry = workloads(s)
    return sum(registry[name][0] for name in selected(s, only))
