"""The live view's snapshot (``engine_snapshot``) as a pure function of published stats, and
``llamactor top``'s rendering of it: no model, no daemon."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from llamactor.cli.sparklines import History
from llamactor.cli.top import render
from llamactor.http.live_snapshot import EngineSnapshot, engine_snapshot

pytestmark = pytest.mark.pure


def stats(**over: Any) -> dict[str, Any]:
    """One replica's published stats as a ready batcher publishes them (the keys the view reads)."""
    base: dict[str, Any] = {
        "state": "ready", "restarts": 0, "running": 2, "pending": 1, "in_flight": 3, "kv_used": 300, "kv_size": 4096,
        "steps": 100, "tokens_generated": 400, "prompt_tokens_computed": 1000, "prompt_rows_scored": 0,
        "embedding_tokens": 0, "embedding_steps": 0, "step_sequences": 250,
        "prefix_cache": {"lookups": 10, "hits": 4, "hit_tokens": 120, "cells": 50},
        "cache_ram": {"entries": 2, "bytes": 2048, "budget_bytes": 1 << 30,
                      "disk": {"entries": 1, "bytes": 4096, "budget_bytes": 1 << 31}}}
    return {**base, **over}


def test_a_first_reading_shows_the_gauges_and_no_rates_yet() -> None:
    snap = engine_snapshot([("m", 0, stats())], None, 0.0, ["m"])
    f = snap.figures
    assert (f.running, f.waiting, f.in_flight, f.kv_used, f.kv_cached, f.kv_free, f.kv_size) == (2, 1, 3, 300, 50, 3796,
                                                                                              4096)
    assert (f.tokens_per_s, f.steps_per_s, f.rows_decode, f.rows_prefill) == (0, 0, 0, 0)
    assert f.steps == 100 and f.prefix_hits == 4 and f.prefix_hit_tokens == 120
    assert (f.ram_entries, f.ram_bytes, f.disk_entries, f.disk_bytes) == (2, 2048, 1, 4096)
    assert snap.interval_s == 0


def test_rates_come_from_the_difference_of_two_readings() -> None:
    before = [("m", 0, stats())]
    now = [("m", 0, stats(steps=110, tokens_generated=480, prompt_tokens_computed=1200, prompt_rows_scored=30,
                          step_sequences=290, embedding_tokens=900, embedding_steps=3))]
    f = engine_snapshot(now, before, 0.5, ["m"]).figures
    assert f.tokens_per_s == 160.0  # 80 tokens in half a second
    assert f.steps_per_s == 20.0
    assert (f.rows_decode, f.rows_prefill, f.rows_scoring, f.rows_embedding) == (8.0, 20.0, 3.0, 300.0)
    assert f.batch_size == 4.0


def test_prompt_tokens_cache_hits_and_kv_use_come_as_rates_and_ratios_for_the_charts() -> None:
    before = [("m", 0, stats())]
    now = [("m", 0, stats(prompt_tokens_computed=1300, kv_used=1024,
                          prefix_cache={"lookups": 14, "hits": 7, "hit_tokens": 200, "cells": 50}))]
    f = engine_snapshot(now, before, 2.0, ["m"]).figures
    assert f.prompt_tokens_per_s == 150.0  # 300 prompt tokens in two seconds
    assert f.prefix_hits_per_s == 1.5 and f.prefix_hit_rate == 0.75  # 3 of 4 lookups hit
    assert f.kv_use == 0.25
    idle = engine_snapshot(before, before, 2.0, ["m"]).figures
    assert idle.prefix_hit_rate == 0 and idle.prefix_hits_per_s == 0  # no lookup: no rate, not a division by zero


def test_the_tenants_shares_are_summed_over_models_and_replicas_by_name() -> None:
    now = [("a", 0, stats(tenants={"bob": {"running": 2, "waiting": 1}, "ann": {"running": 1, "waiting": 0}})),
           ("a", 1, stats(tenants={"bob": {"running": 1, "waiting": 0}})),
           ("b", 0, stats(tenants={"cy": {"running": 0, "waiting": 3}})), ("b", 1, {"state": "starting"})]
    tenants = engine_snapshot(now, None, 0.0, ["a", "b"]).tenants
    assert [(t.name, t.running, t.waiting) for t in tenants] == [("ann", 1, 0), ("bob", 3, 1), ("cy", 0, 3)]
    assert engine_snapshot([("a", 0, stats())], None, 0.0, ["a"]).tenants == []


def test_a_restarted_batcher_whose_counters_went_back_to_zero_shows_no_negative_rate() -> None:
    before = [("m", 0, stats())]
    now = [("m", 0, stats(steps=5, tokens_generated=7, restarts=1))]
    f = engine_snapshot(now, before, 0.25, ["m"]).figures
    assert f.tokens_per_s == 0 and f.steps_per_s == 0 and f.rows_decode == 0
    assert f.restarts == 1


def test_models_and_replicas_are_summed_into_the_totals_and_an_unloaded_model_is_listed() -> None:
    before = [("a", 0, stats()), ("a", 1, stats()), ("b", 0, stats())]
    now = [("a", 0, stats(tokens_generated=500)), ("a", 1, stats(tokens_generated=450)),
           ("b", 0, stats(tokens_generated=410, state="restarting"))]
    snap = engine_snapshot(now, before, 1.0, ["a", "b", "c"])
    assert [m.name for m in snap.models] == ["a", "b", "c"]
    a, b, c = snap.models
    assert a.state == "ready" and a.figures.running == 4 and a.figures.tokens_per_s == 150
    assert [r.figures.tokens_per_s for r in a.replicas] == [100, 50]
    assert b.state == "restarting" and b.figures.tokens_per_s == 10
    assert c.state == "unloaded" and c.replicas == [] and c.figures.running == 0
    assert snap.figures.running == 6 and snap.figures.tokens_per_s == 160 and snap.figures.kv_size == 3 * 4096


def test_a_replica_that_appeared_since_the_last_reading_counts_no_rate_of_its_own() -> None:
    now = [("a", 0, stats(tokens_generated=500)), ("a", 1, stats(tokens_generated=9000))]
    snap = engine_snapshot(now, [("a", 0, stats())], 1.0, ["a"])
    assert snap.figures.tokens_per_s == 100


def test_a_replica_that_is_still_starting_has_only_its_supervisors_figures() -> None:
    snap = engine_snapshot([("m", 0, {"state": "starting", "restarts": 0, "in_flight": 2})], None, 0.0, ["m"])
    assert snap.models[0].state == "starting"
    assert snap.figures.in_flight == 2 and snap.figures.kv_size == 0 and snap.figures.kv_free == 0


def test_unfinished_batch_jobs_are_listed_with_their_progress() -> None:
    batch = {"id": "batch_1", "status": "in_progress", "endpoint": "/v1/chat/completions",
             "request_counts": {"total": 10, "completed": 4, "failed": 1}}
    job = engine_snapshot([], None, 0.0, [], [batch]).jobs[0]
    assert (job.id, job.status, job.endpoint, job.total, job.completed, job.failed) == (
        "batch_1", "in_progress", "/v1/chat/completions", 10, 4, 1)


def test_the_snapshot_survives_a_round_trip_through_json() -> None:
    snap = engine_snapshot([("m", 0, stats())], [("m", 0, stats())], 0.25, ["m"])
    assert EngineSnapshot.model_validate_json(snap.model_dump_json()) == snap


def test_llamactor_top_renders_every_part_of_a_snapshot() -> None:
    batch = {"id": "batch_7", "status": "in_progress", "endpoint": "/v1/embeddings",
             "request_counts": {"total": 10, "completed": 4, "failed": 1}}
    now = [("chat", 0, stats(tokens_generated=480)), ("chat", 1, stats())]
    snap = engine_snapshot(now, [("chat", 0, stats()), ("chat", 1, stats())], 1.0, ["chat", "idle"], [batch])
    console = Console(record=True, width=200)
    console.print(render(snap))
    text = console.export_text()
    for expected in ("running", "tokens/s", "80.0", "decode", "prefill", "chat", "#1", "idle", "unloaded",
                     "batch_7", "5/10 (1 failed)", "2 · 0.0 MiB"):
        assert expected in text, expected


def test_llamactor_top_draws_the_recent_snapshots_as_sparklines_and_the_tenants_shares() -> None:
    history = History(interval_s=1.0)
    before = [("m", 0, stats())]
    for n in range(1, 9):  # eight snapshots of a rising load, one a second
        now = [("m", 0, stats(tokens_generated=400 + 10 * n * n, running=n, kv_used=512 * n,
                              tenants={"ann": {"running": n - 1, "waiting": 0}, "bob": {"running": 1, "waiting": 2}}))]
        snap = engine_snapshot(now, before, 1.0, ["m"])
        history.add(snap.figures)
        before = now
    console = Console(record=True, width=200)
    console.print(render(snap, history))
    lines = console.export_text().splitlines()
    cells = [line.strip("│ ") for line in lines]
    row = {label: next(c for c in cells if c.startswith(label + " ")).replace("│", " ") for label in (
        "tokens/s", "running", "KV use", "ann", "bob")}
    assert "▁▂▃▄▅▆▇█" in row["running"] and row["running"].split()[-2:] == ["8", "8"]  # now, max
    assert row["KV use"].split()[-2:] == ["100.0%", "100.0%"] and "█" in row["KV use"]
    assert row["tokens/s"].split()[1:] == ["▁▂▃▄▅▆▇█", "150", "150"]  # 10, 30 ... 150 tokens a second
    assert "the last 8 s" in "\n".join(lines)
    assert row["ann"].split()[1:4] == ["7", "0", "█" * 18] and row["bob"].split()[1:] == ["1", "2", "██", "12%"]
