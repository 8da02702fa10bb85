"""Tenants in-process, on the real engine: ``tenant=`` on the API's verbs gives each caller its own
prefix cache and a fair share (a quiet tenant is not stuck behind another's flood), and the
limits in ``Config.tenants`` hold."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

import llamactor

STORY = ("In a valley between two rivers stood a mill whose wheel had turned for three hundred years, "
         "and the miller's daughter kept a ledger of every sack of grain. ")


def test_each_tenant_hits_only_its_own_cached_prefix(start_llm) -> None:
    llm = start_llm(n_parallel=2, tenants=[{"name": "team-1", "cache_scope": "team"},
                                           {"name": "team-2", "cache_scope": "team"}])
    ask = dict(max_tokens=1, temperature=0.0)
    assert llm.ask(STORY + "Who?", tenant="alice", **ask).usage.cached_tokens == 0
    assert llm.ask(STORY + "What?", tenant="alice", **ask).usage.cached_tokens > 20  # on: alice's own prefix
    assert llm.ask(STORY + "Who?", tenant="bob", **ask).usage.cached_tokens == 0  # not alice's for bob
    assert llm.ask(STORY + "Who?", **ask).usage.cached_tokens == 0  # nor for the default tenant
    assert llm.ask(STORY + "Which?", tenant="team-1", **ask).usage.cached_tokens == 0
    assert llm.ask(STORY + "Where?", tenant="team-2", **ask).usage.cached_tokens > 20  # a shared cache scope


def test_a_quiet_tenants_request_is_not_stuck_behind_another_tenants_flood(start_llm) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=1)
    finished: list[str] = []
    lock = threading.Lock()

    def record(name: str) -> object:
        def done(_: concurrent.futures.Future[llamactor.Completion]) -> None:
            with lock:
                finished.append(name)
        return done
    flood = [llm.submit(f"Story {i}: once upon a time", max_tokens=16, ignore_eos=True, tenant="flood")
             for i in range(8)]
    for i, f in enumerate(flood):
        f.add_done_callback(record(f"flood-{i}"))  # type: ignore[arg-type]
    quiet = llm.submit("What is two plus two?", max_tokens=4, ignore_eos=True, tenant="quiet")
    quiet.add_done_callback(record("quiet"))  # type: ignore[arg-type]
    concurrent.futures.wait([*flood, quiet], timeout=120)
    # First come, first served it would finish last; fairly, it takes the first sequence that frees.
    assert finished.index("quiet") <= 3, finished


def test_a_tenants_max_running_and_rate_limits_from_config_hold(start_llm) -> None:
    llm = start_llm(n_parallel=4, tenants=[{"name": "capped", "max_running": 1},
                                           {"name": "metered", "requests_per_minute": 1}])
    capped = [llm.submit(f"Count to {i}", max_tokens=8, ignore_eos=True, tenant="capped") for i in range(3)]
    concurrent.futures.wait(capped, timeout=120)
    starts = sorted((c.result().timings.queue_ms, c.result().timings.total_ms) for c in capped)
    for (_, total), (queued, _) in zip(starts, starts[1:]):  # one at a time: each waited for the one before
        assert queued >= total * 0.5
    llm.ask("hi", max_tokens=1, tenant="metered")
    with pytest.raises(llamactor.RateLimitError):
        llm.ask("hi", max_tokens=1, tenant="metered")
