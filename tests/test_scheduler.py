"""The pure scheduling policy, without threads or llama.cpp (real-engine tests cover the same rules)."""

from __future__ import annotations

import pytest

from llamactor.config import SamplingParams
from llamactor.errors import QueueFullError
from llamactor.messages import Generate, ReplyChannel
from llamactor.scheduler import Scheduler, Sequence, SharedPrefix, common_prefix_len


def make_seq(n_prompt: int, *, at: float = 0.0, rid: str = "r", tokens: list[int] | None = None) -> Sequence:
    msg = Generate(request_id=rid, params=SamplingParams(), reply=ReplyChannel(), submitted_at=at, text="x")
    ids = tokens if tokens is not None else list(range(1, n_prompt + 1))
    return Sequence(request=msg, token_ids=ids, n_prompt=len(ids))


def make_scheduler(**overrides: object) -> Scheduler:
    options: dict = dict(n_parallel=2, n_batch=16, batch_size=2, batch_timeout_s=0.02, max_queue=4)
    options.update(overrides)
    return Scheduler(**options)


def test_a_lone_request_waits_for_its_window_and_then_flushes() -> None:
    s = make_scheduler()
    s.add(make_seq(3, at=1.0))
    assert s.flush_deadline() == pytest.approx(1.02)
    assert s.schedule(now=1.01).chunks == []
    plan = s.schedule(now=1.02)
    assert [c.n_tokens for c in plan.chunks] == [3]
    assert plan.chunks[0].samples


def test_a_burst_of_batch_size_flushes_at_once() -> None:
    s = make_scheduler()
    s.add(make_seq(3, at=1.0, rid="a"))
    s.add(make_seq(4, at=1.0, rid="b"))
    assert s.flush_deadline() is None
    plan = s.schedule(now=1.0)
    assert [c.seq.request_id for c in plan.chunks] == ["a", "b"]
    assert sorted(seq.seq_id for seq, _ in plan.admitted) == [0, 1]


def test_newcomers_join_running_sequences_at_the_next_step_without_waiting() -> None:
    s = make_scheduler(n_parallel=3, batch_size=8)
    s.add(make_seq(2, at=0.0, rid="a"))
    s.schedule(now=1.0)
    s.running[0].n_past = 2
    s.running[0].token_ids.append(99)  # sampled one token
    s.add(make_seq(2, at=1.0, rid="b"))
    plan = s.schedule(now=1.0)  # no window wait: sequences are running
    assert [(c.seq.request_id, c.n_tokens) for c in plan.chunks] == [("a", 1), ("b", 2)]


def test_requests_beyond_the_pool_wait_for_a_free_seq_id() -> None:
    s = make_scheduler(n_parallel=1, batch_size=1)
    first, second = make_seq(2, rid="a"), make_seq(2, rid="b")
    s.add(first)
    s.add(second)
    s.schedule(now=0.0)
    assert [q.request_id for q in s.pending] == ["b"]
    s.finish(first)
    assert list(s.free_seq_ids) == [0]
    plan = s.schedule(now=0.0)
    assert plan.admitted[0][0] is second and second.seq_id == 0


def test_the_token_budget_puts_decode_tokens_first_and_chunks_long_prompts() -> None:
    s = make_scheduler(n_parallel=2, n_batch=8, batch_size=1)
    short = make_seq(2, rid="short")
    s.add(short)
    s.schedule(now=0.0)
    short.n_past, short.token_ids = 2, short.token_ids + [7]
    s.add(make_seq(20, rid="long"))
    plan = s.schedule(now=0.0)
    assert [(c.seq.request_id, c.n_tokens, c.samples) for c in plan.chunks] == [("short", 1, True), ("long", 7, False)]


def test_a_full_queue_refuses_only_beyond_max_queue_requests_waiting_for_a_sequence() -> None:
    s = make_scheduler(n_parallel=2, max_queue=1)
    for _ in range(3):  # two will get the free seq_ids at the flush, one waits
        s.add(make_seq(2))
    with pytest.raises(QueueFullError):
        s.add(make_seq(2))


def test_admission_attaches_the_longest_shared_prefix_but_computes_at_least_one_token() -> None:
    prefixes = (SharedPrefix(seq_id=5, token_ids=(1, 2, 3)), SharedPrefix(seq_id=6, token_ids=(1, 2, 3, 4, 5)))
    s = make_scheduler(shared_prefixes=prefixes, batch_size=1)
    s.add(make_seq(0, tokens=[1, 2, 3, 4, 9]))
    plan = s.schedule(now=0.0)
    seq, source = plan.admitted[0]
    assert (source, seq.n_cached, seq.n_past) == (6, 4, 4)
    assert plan.chunks[0].n_tokens == 1
    s2 = make_scheduler(shared_prefixes=prefixes, batch_size=1)
    s2.add(make_seq(0, tokens=[1, 2, 3]))
    seq2, _ = s2.schedule(now=0.0).admitted[0]
    assert seq2.n_cached == 2


def test_common_prefix_len_counts_equal_leading_tokens() -> None:
    assert common_prefix_len((1, 2, 3), [1, 2, 4]) == 2
    assert common_prefix_len((), [1]) == 0
