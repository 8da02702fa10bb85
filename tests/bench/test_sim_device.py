"""The simulated device: a modelled step time and its busy record (pure), and the real batcher on
it -- the overlapped loop postprocesses step k between launching and collecting step k+1, the
serial loop never does -- and the ``sim_device`` workload end to end at a tiny size."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llamactor.bench import report, sim_device
from llamactor.bench.replay import Recording, null_config
from llamactor.bench.sim_device import measure_sim_device, record
from llamactor.bench.simulated_device import SimulatedDevice, start_simulated_tree
from llamactor.tree import step_postprocess
from llamactor.tree.batcher import BatcherActor


@pytest.mark.pure
def test_the_device_queues_steps_in_order_and_records_how_busy_it_was() -> None:
    device = SimulatedDevice(fixed_ms=1.0, row_ms=0.5)
    first = device.start(4, "a")  # 3 ms
    second = device.start(2, "b")  # queued behind the first: 2 ms
    assert second.begin == first.ready and second.ready - first.begin == pytest.approx(0.005)
    assert device.wait(first) == "a" and device.wait(second) == "b"
    assert device.events == [("launch", 0), ("launch", 1), ("collect", 0), ("collect", 1)]
    busy, span, steps = device.busy_fraction()
    assert steps == 2 and span >= 0.005 and 0 < busy <= 1


@pytest.fixture(scope="module")
def recording(model_path: str) -> Recording:
    return record(model_path, n_threads=2)


def interleaving(recording: Recording, model_path: str, overlap: bool,
                 monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The device's launches and collections, each postprocess's acceptance of tokens, and the ends
    of the batcher's messages (where it publishes its stats), in order."""
    device = SimulatedDevice(fixed_ms=1.0, row_ms=0.1)
    accept, publish = step_postprocess.accept_tokens, BatcherActor._publish

    def recorded(draw: Any, *args: Any) -> None:
        if draw.seqs:
            device.events.append(("accept", len(draw.seqs)))
        accept(draw, *args)
    def published(actor: BatcherActor, now: float) -> None:
        device.events.append(("message_end", None))
        publish(actor, now)
    monkeypatch.setattr(step_postprocess, "accept_tokens", recorded)
    monkeypatch.setattr(BatcherActor, "_publish", published)
    config = null_config(4, model=model_path, n_threads=2, n_ctx=1024, max_restarts=0, sample_in_graph=True,
                         overlap_steps=overlap)
    with start_simulated_tree(config, recording, device) as llm:
        futures = [llm.submit(f"Story {i}", max_tokens=12, ignore_eos=True, temperature=0.0) for i in range(4)]
        assert [f.result(timeout=120).usage.completion_tokens for f in futures] == [12] * 4
    return device.events


def while_in_flight(events: list[tuple[str, Any]], what: str) -> tuple[int, int]:
    """How many events of kind ``what`` happened while a launched step was not yet collected, of how many."""
    in_flight, during, total = 0, 0, 0
    for kind, _ in events:
        in_flight += {"launch": 1, "collect": -1}.get(kind, 0)
        if kind == what:
            total += 1
            during += in_flight > 0
    return during, total


def test_the_overlapped_loop_postprocesses_each_step_while_the_next_is_on_the_device(
        recording: Recording, model_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    overlapped = interleaving(recording, model_path, True, monkeypatch)
    during, total = while_in_flight(overlapped, "accept")
    # all but the last step's (nothing left to launch) and the tokens that surely end their requests
    assert total >= 10 and during >= total - 2
    # a step stays in flight when its message ends: the actor's work between steps is off the device's path
    during, total = while_in_flight(overlapped, "message_end")
    assert during >= 10
    serial = interleaving(recording, model_path, False, monkeypatch)
    assert while_in_flight(serial, "accept")[0] == 0 and while_in_flight(serial, "message_end")[0] == 0


def test_the_sim_device_workload_reports_both_loops_in_process_and_over_sse(model_path: str) -> None:
    r = measure_sim_device(model_path, max_tokens=6, n_threads=2, sizes=(4,), repeats=1)
    legs = r["sizes"]["c4"]
    assert set(legs) == {"serial", "overlapped", "serial_sse", "overlapped_sse"}
    # every leg's 4 streams took their 6 steps on the device, the SSE ones through the daemon's app
    assert all(0 < leg["busy"] <= 1 and leg["steps"] >= 6 and leg["tokens_per_s"] > 0 for leg in legs.values())
    assert 0 < r["min_busy_overlapped_sse"] <= 1
    table = report.markdown({"sim_device": r}, {"timestamp": "t", "machine": "m", "model": "g",
                                                "settings": {"n_threads": 2, "max_tokens": 6, "quick": True}})
    assert "| 4 | in-process |" in table and "| 4 | SSE |" in table
    assert "sim_device: device busy share" in table and "sim_device over HTTP (SSE)" in table


@pytest.mark.pure
def test_a_row_that_misses_the_goal_says_where_a_steps_time_went() -> None:
    def leg(busy: float) -> dict[str, float]:
        return {"busy": busy, "tokens_per_s": 1000.0, "rows_dropped": 0, "device_ms": 16.0, "wake_p50_ms": 0.5,
                "wake_p90_ms": 2.0, "path_p50_ms": 1.5, "path_p90_ms": 3.0, "schedule_ms": 0.4, "postprocess_ms": 0.7}
    r = {"max_tokens": 64, "fixed_ms": 2.4, "row_ms": 0.216,
         "sizes": {"c64": {"serial": leg(0.9), "overlapped": leg(0.97), "serial_sse": leg(0.8),
                           "overlapped_sse": leg(0.91)}}}
    lines = sim_device.report_lines({"sim_device": r})
    assert "| 64 | in-process | 90.0% | 97.0% | met |" in "\n".join(lines)
    assert "| 64 | SSE | 80.0% | 91.0% | missed |" in "\n".join(lines)
    missed = [line for line in lines if line.startswith("- missed")]
    assert len(missed) == 1 and "64 streams, SSE" in missed[0] and "late wake 0.50 ms median" in missed[0]
    assert "path to the next launch 1.50 / 3.00 ms" in missed[0]
