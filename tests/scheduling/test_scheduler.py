"""The pure scheduling policy, without threads or llama.cpp (real-engine tests cover the same rules)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamactor.base.errors import QueueFullError
from llamactor.scheduling.kv_nodes import KvOp, common_prefix_len
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.sequence import Chunk

from tests.support.scheduling import make_scheduler, make_seq, run_to_end

pytestmark = pytest.mark.pure


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
    s.add(make_seq(0, at=1.0, rid="b", tokens=[7, 8, 9, 10]))
    assert s.flush_deadline() is None
    plan = s.schedule(now=1.0)
    assert [c.seq.request_id for c in plan.chunks] == ["a", "b"]
    assert sorted(seq.seq_id for seq in plan.admitted) == [0, 1]


def test_newcomers_join_running_sequences_at_the_next_step_without_waiting() -> None:
    s = make_scheduler(n_parallel=3, batch_size=8)
    s.add(make_seq(2, at=0.0, rid="a"))
    for chunk in s.schedule(now=1.0).chunks:
        s.computed(chunk, 1.0)
    s.running[0].token_ids.append(99)  # sampled one token
    s.add(make_seq(0, at=1.0, rid="b", tokens=[5, 6]))
    plan = s.schedule(now=1.0)  # no window wait: sequences are running
    assert [(c.seq.request_id, c.n_tokens) for c in plan.chunks] == [("a", 1), ("b", 2)]


def test_requests_beyond_the_pool_wait_for_a_free_seq_id() -> None:
    s = make_scheduler(n_parallel=1, batch_size=1)
    first, second = make_seq(2, rid="a"), make_seq(2, rid="b")
    s.add(first)
    s.add(second)
    s.schedule(now=0.0)
    assert [q.request_id for q in s.pending] == ["b"] and s.n_free == 0
    s.finish(first, 0.0)
    assert s.n_free == 1
    plan = s.schedule(now=0.0)
    assert plan.admitted[0] is second and second.seq_id != -1


def test_the_token_budget_puts_decode_tokens_first_and_chunks_long_prompts() -> None:
    s = make_scheduler(n_parallel=2, n_batch=8, batch_size=1)
    short = make_seq(2, rid="short")
    s.add(short)
    for chunk in s.schedule(now=0.0).chunks:
        s.computed(chunk, 0.0)
    short.token_ids.append(7)
    s.add(make_seq(0, rid="long", tokens=list(range(30, 50))))
    plan = s.schedule(now=0.0)
    assert [(c.seq.request_id, c.n_tokens, c.samples) for c in plan.chunks] == [("short", 1, True), ("long", 7, False)]


def test_a_full_queue_refuses_only_beyond_max_queue_requests_waiting_for_a_sequence() -> None:
    s = make_scheduler(n_parallel=2, max_queue=1)
    for _ in range(3):  # two will get the free seq_ids at the flush, one waits
        s.add(make_seq(2))
    with pytest.raises(QueueFullError):
        s.add(make_seq(2))


def test_admission_attaches_the_longest_cached_prefix_but_computes_at_least_one_token() -> None:
    s = make_scheduler(batch_size=1)
    first = make_seq(0, tokens=[1, 2, 3, 4, 5])
    s.add(first)
    ops = run_to_end(s, first)
    assert ops == []  # kept as a cached prefix, not removed
    s.add(make_seq(0, tokens=[1, 2, 3, 4, 9]))
    plan = s.schedule(now=1.0)
    seq = plan.admitted[0]
    assert (seq.n_cached, seq.n_past) == (4, 4)
    assert plan.kv_ops == [KvOp(seq.seq_id, 4, src=first.seq_id)]
    assert [c.n_tokens for c in plan.chunks] == [1]
    s.add(make_seq(0, tokens=[1, 2, 3]))
    assert s.schedule(now=1.0).admitted[0].n_cached == 2  # the whole prompt is cached: one token is recomputed


def test_without_the_prefix_cache_finished_sequences_are_freed_and_only_pinned_prefixes_attach() -> None:
    index = PrefixIndex(n_seq_ids=8, n_cells=1000)
    system_id, _ = index.allocate()
    index.extend(system_id, [1, 2, 3], 0.0)
    index.pin(system_id)
    s = make_scheduler(batch_size=1, index=index, keep_finished=False)
    first = make_seq(0, tokens=[1, 2, 3, 4, 5, 6])
    s.add(first)
    assert run_to_end(s, first) == [KvOp(first.seq_id)]
    s.add(make_seq(0, tokens=[1, 2, 3, 4, 5, 7]))
    assert s.schedule(now=1.0).admitted[0].n_cached == 3


def test_requests_sharing_a_prompt_wait_for_the_first_to_compute_it_then_attach_it() -> None:
    s = make_scheduler(n_parallel=4, batch_size=3, n_batch=64)
    prompt = list(range(100, 140))  # 40 tokens, longer than share_min_tokens
    siblings = [make_seq(0, tokens=list(prompt), rid=f"r{i}") for i in range(3)]
    for seq in siblings:
        s.add(seq)
    plan = s.schedule(now=0.0)
    assert [q.request_id for q in plan.admitted] == ["r0"] and len(s.pending) == 2
    for chunk in plan.chunks:
        s.computed(chunk, 0.0)
    siblings[0].token_ids.append(7)  # its first sampled token
    plan = s.schedule(now=0.0)
    assert [q.request_id for q in plan.admitted] == ["r1", "r2"]
    assert [q.n_cached for q in plan.admitted] == [39, 39]
    assert sorted((c.seq.request_id, c.n_tokens) for c in plan.chunks) == [("r0", 1), ("r1", 1), ("r2", 1)]


def test_a_request_sharing_only_a_short_prefix_with_a_running_one_does_not_wait() -> None:
    s = make_scheduler(n_parallel=4, batch_size=2, n_batch=64)
    s.add(make_seq(0, tokens=list(range(100, 140)), rid="long"))
    s.add(make_seq(0, tokens=list(range(100, 110)) + [1, 2, 3], rid="short-share"))
    assert [q.request_id for q in s.schedule(now=0.0).admitted] == ["long", "short-share"]


def test_a_step_that_needs_more_cells_than_are_free_evicts_cached_prefixes_first() -> None:
    s = make_scheduler(n_cells=12, batch_size=1)
    old = make_seq(0, tokens=list(range(1, 9)))
    s.add(old)
    run_to_end(s, old)  # 8 cells stay cached
    s.add(make_seq(0, tokens=list(range(20, 27))))  # 7 new tokens: 3 more than the 4 free cells
    plan = s.schedule(now=1.0)
    assert plan.kv_ops == [KvOp(old.seq_id, 5)]
    assert s.index.cells_used == 5


def test_common_prefix_len_counts_equal_leading_tokens() -> None:
    assert common_prefix_len((1, 2, 3), [1, 2, 4]) == 2
    assert common_prefix_len((), [1]) == 0


@settings(max_examples=300, deadline=None)
@given(n_prompt=st.integers(1, 12), n_generated=st.integers(0, 4), data=st.data(), prompt_only=st.booleans(),
       labels=st.booleans(), scored=st.booleans())
def test_what_a_chunk_does_with_its_rows_is_its_definition_when_planned(
        n_prompt: int, n_generated: int, data: st.DataObject, prompt_only: bool, labels: bool, scored: bool) -> None:
    """``Chunk`` keeps ``samples``, ``reads_labels``, ``output_last`` and ``n_score_rows`` as
    planned (read once per row per step): each is its definition off the sequence at planning."""
    seq = make_seq(n_prompt + n_generated)
    seq.n_prompt, seq.prompt_only = n_prompt, prompt_only or labels
    seq.labels = ((1,), (2,)) if labels else ()
    seq.n_past = data.draw(st.integers(0, len(seq.token_ids) - 1))
    n = data.draw(st.integers(1, len(seq.token_ids) - seq.n_past))
    lo = data.draw(st.integers(seq.n_past, seq.n_past + n)) if scored else 0
    hi = data.draw(st.integers(lo, seq.n_past + n)) if scored else 0
    end = seq.n_past + n
    samples = end == len(seq.token_ids) and not seq.prompt_only
    drafts = (5, 6) if samples and data.draw(st.booleans()) else ()
    chunk = Chunk(seq, n, lo, hi, drafts)
    reads_labels = labels and end == n_prompt
    assert (chunk.samples, chunk.reads_labels, chunk.output_last, chunk.n_score_rows) == (
        samples, reads_labels, samples or reads_labels, hi - lo)
    seq.n_past += n  # the step is computed: the chunk still says what its rows were
    seq.token_ids.append(7)
    assert (chunk.samples, chunk.reads_labels, chunk.output_last) == (samples, reads_labels, samples or reads_labels)
