"""Prompt scoring in the pure scheduler: which rows a step flags, the row budget, what a cache hit may
attach (nothing while a prompt scores, but in the batch-invariant mode), preemption, and the
ScoreCache (real-engine tests of the same rules: test_scoring.py)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from llamactor.scheduling.packed_kv import PackedPrefixIndex, PackedScheduler
from llamactor.scheduling.prompt_scores import PromptScore, ScoreCache, ScoreState, reusable_end
from llamactor.scheduling.sequence import Sequence

from tests.support.scheduling import make_scheduler, make_seq, run_to_end

pytestmark = pytest.mark.pure


def scoring_seq(tokens: list[int], *, start: int = 1, n_top: int = 1, rid: str = "s",
                prompt_only: bool = True) -> Sequence:
    seq = make_seq(0, tokens=tokens, rid=rid)
    seq.scoring = ScoreState(start=start, n_prompt=len(tokens), n_top=n_top)
    seq.prompt_only = prompt_only
    return seq


def record_rows(seq: Sequence, lo: int, hi: int) -> None:
    """What the batcher does with a chunk's rows: an entry for each following position."""
    assert seq.scoring is not None
    for p in range(lo, hi):
        seq.scoring.record(p, PromptScore(-float(seq.token_ids[p + 1]), 1, (seq.token_ids[p + 1],), (-0.5,)))


def cache_prompt(s, tokens: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Run a plain request to its end: its KV stays as a cached prefix."""
    warm = make_seq(0, tokens=tokens, rid="warm")
    s.add(warm)
    run_to_end(s, warm, now=1.0)


def run_step(s, now: float = 1.0) -> list:  # type: ignore[no-untyped-def]
    plan = s.schedule(now)
    for chunk in plan.chunks:
        s.computed(chunk, now)
        if chunk.n_score_rows:
            record_rows(chunk.seq, chunk.score_lo, chunk.score_hi)
            s.prompt_scored(chunk.seq)
    return plan.chunks


def test_a_scored_prompt_flags_every_row_but_the_last_and_samples_nothing_with_max_tokens_zero() -> None:
    s = make_scheduler(n_batch=64)
    seq = scoring_seq(list(range(1, 11)))
    s.add(seq)
    plan = s.schedule(now=1.0)
    assert [(c.n_tokens, c.score_lo, c.score_hi, c.samples) for c in plan.chunks] == [(10, 0, 9, False)]
    assert plan.rows()[3] == [1] * 9 + [0]


def test_a_scored_prompt_that_generates_gets_its_sampling_row_after_its_prompt_rows() -> None:
    s = make_scheduler(n_batch=64)
    s.add(scoring_seq(list(range(1, 6)), prompt_only=False))
    plan = s.schedule(now=1.0)
    assert plan.chunks[0].samples and plan.rows()[3] == [1, 1, 1, 1, 1]


def test_the_row_budget_splits_a_long_prompt_over_steps_and_shares_rows_between_prompts() -> None:
    s = make_scheduler(n_batch=64, score_rows=8)
    a, b = scoring_seq(list(range(1, 21)), rid="a"), scoring_seq(list(range(100, 105)), rid="b")
    s.add(a)
    s.add(b)
    first = run_step(s)
    assert [(c.seq.request_id, c.n_tokens, c.n_score_rows) for c in first] == [("a", 8, 8)]
    steps = [first]
    while a.n_past < a.n_prompt or b.n_past < b.n_prompt:
        steps.append(run_step(s))
        assert sum(c.n_score_rows for c in steps[-1]) <= 8
    assert a.scoring is not None and b.scoring is not None
    assert a.scoring.done and b.scoring.done
    assert [e.logprob for e in a.scoring.entries[1:]] == [-float(t) for t in range(2, 21)]


def continuation_after_cached_context(s) -> tuple[Sequence, list]:  # type: ignore[no-untyped-def]
    """A cached 30-token context, then a 2-token continuation of it scored: (it, its first step's chunks)."""
    context = list(range(1, 31))
    cache_prompt(s, context + [50])
    scored = scoring_seq(context + [60, 61], start=30)
    s.add(scored)
    return scored, s.schedule(2.0).chunks


def test_a_continuation_scores_only_its_own_tokens_and_computes_its_context_whole() -> None:
    scored, chunks = continuation_after_cached_context(make_scheduler(n_batch=64))
    # no cached KV: the whole prompt in one chunk, as it would be alone, its continuation's rows flagged
    assert scored.n_cached == 0 and [(c.n_tokens, c.score_lo, c.score_hi) for c in chunks] == [(32, 29, 31)]


def test_in_the_batch_invariant_mode_a_continuation_attaches_its_context_from_the_cache() -> None:
    s = PackedScheduler(n_parallel=2, n_batch=64, batch_size=2, batch_timeout_s=0.02, max_queue=4,
                        index=PackedPrefixIndex(n_seq_ids=8, n_cells=1000))
    scored, chunks = continuation_after_cached_context(s)
    # the context's KV is attached up to the row before the continuation: that row is computed
    assert scored.n_cached == 29 and [(c.n_tokens, c.score_lo, c.score_hi) for c in chunks] == [(3, 29, 31)]


@given(n_tokens=st.integers(1, 60), start=st.integers(1, 60), next_row=st.integers(0, 60), attach=st.booleans())
def test_no_kv_is_reused_where_a_row_is_still_needed_and_none_while_scoring_unless_attaching(
        n_tokens: int, start: int, next_row: int, attach: bool) -> None:
    assume(start <= n_tokens)
    state = ScoreState(start=start, n_prompt=n_tokens, n_top=1, next_row=next_row)
    end = reusable_end(n_tokens, state, attach)
    assert 0 <= end <= max(n_tokens - 1, 0)
    if not state.done:
        assert end <= state.next_row and (attach or end == 0)
    else:
        assert end == n_tokens - 1 == reusable_end(n_tokens, None, attach)


def test_an_echo_prompt_attaches_no_kv_whose_rows_it_still_needs() -> None:
    s = make_scheduler(n_batch=64)
    tokens = list(range(1, 31))
    cache_prompt(s, tokens + [99])
    echo = scoring_seq(tokens + [7])
    s.add(echo)
    s.schedule(2.0)
    assert echo.n_cached == 0 and echo.n_past == 0


def test_prompts_sharing_a_prefix_compute_its_rows_once_through_the_score_cache() -> None:
    s = make_scheduler(n_batch=64, n_parallel=4, batch_size=4)
    question = list(range(1, 21))
    choices = [scoring_seq(question + [100 + i, 200 + i], rid=f"c{i}") for i in range(4)]
    for seq in choices:
        s.add(seq)
    rows = 0
    while any(not c.scoring.done for c in choices):  # type: ignore[union-attr]
        rows += sum(c.n_score_rows for c in run_step(s))
        for seq in list(s.running):
            if seq.n_past == seq.n_prompt:
                s.finish(seq, 0.0)
    # the first choice computes the question's 21 rows; the others only their last 2 rows each
    assert rows == 21 + 3 * 2
    assert s.score_cache.hits == 3 * 19
    for seq in choices[1:]:
        assert seq.scoring is not None
        assert [e.logprob for e in seq.scoring.entries[1:21]] == [-float(t) for t in range(2, 21)] + [-float(seq.token_ids[20])]


def test_a_preempted_scoring_sequence_resumes_without_computing_its_rows_again() -> None:
    s = make_scheduler(n_batch=64, score_rows=4)
    seq = scoring_seq(list(range(1, 13)))
    s.add(seq)
    run_step(s)
    run_step(s)
    assert seq.scoring is not None and seq.scoring.next_row == 8
    s.running.remove(seq)  # as _preempt does: back among the waiting, KV released
    s.index.release(seq.seq_id)
    seq.seq_id, seq.n_past, seq.n_preempted = -1, 0, 1
    s.pending.append(seq)
    chunks = run_step(s, now=2.0)
    assert [(c.n_tokens, c.score_lo, c.score_hi) for c in chunks] == [(12, 8, 11)]


def test_the_score_cache_answers_only_what_matches_and_has_enough_alternatives() -> None:
    cache = ScoreCache(max_positions=100)
    done = ScoreState(start=1, n_prompt=6, n_top=2)
    for p in range(5):
        done.record(p, PromptScore(-p, 1, (p, p + 1), (-0.1, -0.2)))
    cache.put("t", [1, 2, 3, 4, 5, 6], done)
    wants_more = ScoreState(start=1, n_prompt=6, n_top=3)
    assert cache.fill("t", [1, 2, 3, 4, 5, 6], wants_more) == 0
    diverges = ScoreState(start=1, n_prompt=6, n_top=1)
    # positions 1..3 are valid (their tokens and all before agree); position 4's token differs
    assert cache.fill("t", [1, 2, 3, 4, 9, 9], diverges) == 3 and diverges.next_row == 3
    assert diverges.entries[3] == PromptScore(-2, 1, (2,), (-0.1,))


def test_the_score_cache_forgets_the_least_recently_used_prompts_beyond_its_size() -> None:
    cache = ScoreCache(max_positions=10)
    for first in (1, 2, 3):
        state = ScoreState(start=1, n_prompt=5, n_top=0)
        for p in range(4):
            state.record(p, PromptScore(-1.0, 1, (), ()))
        cache.put("t", [first, 7, 7, 7, 7], state)
    assert len(cache) == 2
    assert cache.fill("t", [1, 7, 7, 7, 7], ScoreState(start=1, n_prompt=5, n_top=0)) == 0
    assert cache.fill("t", [3, 7, 7, 7, 7], ScoreState(start=1, n_prompt=5, n_top=0)) == 4


def test_beside_other_callers_work_scoring_adds_only_its_share_to_a_step() -> None:
    s = make_scheduler(n_batch=256, n_parallel=4, batch_size=4, score_share=0.25)
    generating = [make_seq(0, tokens=[500 + i, 600 + i], rid=f"g{i}") for i in range(3)]
    for seq in generating:
        s.add(seq)
    run_step(s)  # their prompts are in: from now on each decodes one token a step
    for seq in generating:
        seq.token_ids.append(7)
    scored = scoring_seq(list(range(1, 101)))
    s.add(scored)
    chunks = run_step(s, now=2.0)
    [chunk] = [c for c in chunks if c.seq is scored]
    # the decoders' work is 3 tokens + 3 rows = 9 units: scoring gets max(3, 0.25 * 9) units = 1 row
    assert (chunk.n_tokens, chunk.n_score_rows) == (1, 1)
    for seq in generating:
        s.finish(seq, 2.0)
    alone = run_step(s, now=2.0)
    assert alone[0].n_score_rows == 64  # alone again: the whole row budget
