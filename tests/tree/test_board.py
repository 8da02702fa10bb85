"""Stats come from the tree's board: reading them waits for no actor, and the supervisor keeps
forwarding requests while a decode step is stuck."""

from __future__ import annotations

from typing import Any


def test_a_stuck_decode_step_stalls_neither_published_stats_nor_request_forwarding(start_llm: Any) -> None:
    # The first decode blocks inside llama_decode until the watchdog aborts it (after 3 s).
    llm = start_llm(n_parallel=2, watchdog_timeout_s=3, watchdog_test_hang=True, batch_timeout_ms=0)
    first = llm.submit("Once upon a time", max_tokens=2, temperature=0)
    published = llm.published_stats()
    assert published["state"] == "ready" and published["restarts"] == 0
    second = llm.submit("Twice upon a time", max_tokens=2, temperature=0)
    # Asked after both submissions from this thread, the supervisor answers after forwarding them:
    # it never waits for the batcher (it used to, for every stats() call, health check and scrape).
    assert len(llm._supervisor.proxy().inflight.get(timeout=30)) == 2
    assert not first.done() and llm.published_stats()["restarts"] == 0  # the step was still stuck
    # The watchdog then aborts the step, the batcher restarts and both requests are replayed.
    assert first.result(timeout=60).usage.completion_tokens == 2
    assert second.result(timeout=60).usage.completion_tokens == 2
    assert llm.stats()["restarts"] == 1 and llm.stats()["watchdog_trips"] == 1


def test_published_stats_are_exact_once_the_batcher_is_idle(start_llm: Any) -> None:
    llm = start_llm(n_parallel=2)
    futures = [llm.submit(f"Count to {i}:", max_tokens=3, temperature=0) for i in range(3)]
    for future in futures:
        future.result(timeout=60)
    exact = llm.stats()  # asks the batcher between steps: it has gone idle and published
    published = llm.published_stats()
    for key in ("running", "pending", "requests_finished", "steps", "tokens_generated", "free_seq_ids"):
        assert published[key] == exact[key], key
    assert exact["requests_finished"] == 3 and exact["running"] == 0 and exact["pending"] == 0
