"""The live view's snapshot (``engine_snapshot``) as a pure function of published stats, and
``llamactor top``'s rendering of it: no model, no daemon."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

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
