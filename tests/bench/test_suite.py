"""The benchmark's runner (``llamactor.bench.suite``) and ``llamactor bench``'s run kinds, model-free:
which workloads a quick, default or ``--only`` run measures, their progress ticks and timings."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from llamactor.bench import report, suite
from llamactor.bench.settings import BenchSettings
from llamactor.cli.commands import main

pytestmark = pytest.mark.pure


def test_a_quick_run_measures_the_smoke_set_and_only_names_any_workload() -> None:
    quick, default = BenchSettings(model_path="m.gguf", quick=True), BenchSettings(model_path="m.gguf")
    assert suite.selected(quick) == [name for name in suite.workloads(quick) if name in suite.QUICK]
    assert set(suite.selected(quick)) == set(suite.QUICK)
    assert suite.selected(default) == list(suite.workloads(default))
    assert suite.selected(quick, ["tenants", "uniform"]) == ["uniform", "tenants"]  # the registry's order
    assert suite.n_ticks(quick) == sum(suite.workloads(quick)[name][0] for name in suite.QUICK)


def test_the_runner_times_each_workload_and_records_a_failure_beside_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(s: BenchSettings, tick: Any) -> None:
        raise RuntimeError("boom")

    def fine(s: BenchSettings, tick: Any) -> dict[str, float]:
        tick()
        return {"ratio": 1.0}
    monkeypatch.setattr(suite, "workloads", lambda s: {"a": (1, broken), "b": (1, fine), "c": (1, fine)})
    s, ticks = BenchSettings(model_path="m.gguf"), []
    results = suite.run(s, lambda: ticks.append(1), ["a", "b"])
    assert results == {"a": {"error": "RuntimeError: boom"}, "b": {"ratio": 1.0}} and ticks == [1]
    assert set(s.seconds) == {"a", "b"} and suite.failures(results) == {"a": "RuntimeError: boom"}
    assert report.seconds_line({"a": 1.25, "b": 2.0}) == "seconds: a 1.2, b 2.0; total 3.2"


def test_the_header_names_the_run_kind() -> None:
    assert [report.run_kind({"quick": q, "full": f}) for q, f in ((True, False), (False, True), (False, False))] == [
        "quick", "full", "default"]


def test_a_run_is_either_quick_or_full() -> None:
    result = CliRunner().invoke(main, ["bench", "--quick", "--full", "--model", "m.gguf"])
    assert result.exit_code == 2 and "either --quick or --full" in result.output
