"""Which sequences draft and the rows a step adds for them (pure: the scheduler over a prefix
index, no model): within draft_max, max_tokens, the context and the step's room; the batch the
step decodes and the output rows it reads back; and, on the real model, a fresh tree's budget:
its steps timed, then probed."""

from __future__ import annotations

from collections.abc import Sequence as Tokens

import pytest

from llamactor.base.messages import Generate, ReplyChannel
from llamactor.base.sampling import SamplingParams
from llamactor.scheduling.sequence import Chunk, Sequence, StepPlan
from llamactor.tree.counters import StepCounters
from llamactor.tree.draft_rows import DraftRows
from llamactor.tree.output_rows import OutputRows
from llamactor.tree.request_state import RequestState

from tests.support.scheduling import make_scheduler


class ByteTokenizer:
    def check_ids(self, *args: object) -> None: ...


def drafting(params: SamplingParams, n_prompt: int = 4, n_generated: int = 1) -> Sequence:
    """A running sequence that sampled its last token (``n_past`` one short)."""
    msg = Generate(request_id="r", params=params, submitted_at=0.0, text="x", reply=ReplyChannel())
    seq = Sequence(request=msg, token_ids=list(range(1, n_prompt + n_generated + 1)), n_prompt=n_prompt)
    seq.state = RequestState.create(params, ByteTokenizer())  # type: ignore[arg-type]
    seq.state.n_generated = n_generated
    seq.seq_id, seq.n_past = 0, n_prompt + n_generated - 1
    return seq


def rows(enabled: bool = True, draft_max: int = 16, n_ctx_seq: int = 1000) -> DraftRows:
    return DraftRows(enabled=enabled, draft_max=draft_max, n_batch=64, n_ubatch=32, n_ctx_seq=n_ctx_seq,
                     counts=StepCounters().counts)


PREDICTED = SamplingParams(max_tokens=100, prediction="x")


@pytest.mark.pure
def test_only_a_request_that_asks_gets_a_drafter_and_never_in_batch_invariant_mode() -> None:
    for params, enabled, expected in [(PREDICTED, True, True), (SamplingParams(speculation="ngram"), True, True),
                                      (SamplingParams(), True, False), (PREDICTED, False, False)]:
        seq = drafting(params)
        rows(enabled).give(seq, [7, 8, 9] if params.prediction else None)
        assert (seq.state.drafter is not None) == expected, (params, enabled)


@pytest.mark.pure
@pytest.mark.parametrize(("max_tokens", "n_ctx_seq", "draft_max", "limit"), [
    (100, 1000, 16, 16),  # draft_max
    (5, 1000, 16, 3),  # one generated, the drafts and one more token: 5
    (None, 10, 16, 4),  # 5 tokens in, the drafts and one more within 10
    (2, 1000, 16, 0),  # the next token is its last: nothing to draft
])
def test_a_sequence_never_drafts_past_its_max_tokens_or_its_context(max_tokens: int | None, n_ctx_seq: int,
                                                                     draft_max: int, limit: int) -> None:
    seq = drafting(SamplingParams(max_tokens=max_tokens, prediction="x"))
    assert rows(draft_max=draft_max, n_ctx_seq=n_ctx_seq).limit(seq) == limit


@pytest.mark.pure
def test_drafts_stay_within_one_ubatch_when_the_step_fits_in_one() -> None:
    assert rows().batch_room(1) == 31 and rows().batch_room(32) == 0 and rows().batch_room(40) == 24


class FixedDrafter:
    """Proposes a fixed list (the real drafters are test_drafts.py's)."""

    acceptance = 0.9
    unproven = False

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, tokens: Tokens[int], n_prompt: int, k: int) -> list[int]:
        return self.tokens[:k]

    def observe(self, n_drafted: int, n_accepted: int) -> None: ...


def timed(draft_rows: DraftRows) -> DraftRows:
    """``draft_rows`` after decode steps of 1 to 8 rows, each 10 ms and 0.1 ms a row (a GPU's)."""
    for n in range(1, 9):
        draft_rows.stepped(n, n, 10 + 0.1 * n)
    return draft_rows


def planned_step(n_cells: int) -> tuple[Sequence, StepPlan]:
    """A step of one decode row for a sequence whose drafter proposes 50, 51, 52, drafts added."""
    scheduler = make_scheduler(n_cells=n_cells)
    seq = drafting(PREDICTED)
    seq.state.drafter = FixedDrafter([50, 51, 52])
    seq.seq_id, _ = scheduler.index.allocate(None)
    scheduler.index.extend(seq.seq_id, seq.token_ids[:seq.n_past], 0.0)
    plan = StepPlan(chunks=[Chunk(seq, 1)])
    timed(rows()).add_to(plan, scheduler)
    return seq, plan


@pytest.mark.pure
def test_granted_drafts_are_rows_with_logits_after_the_chunk_and_their_output_rows_follow() -> None:
    seq, plan = planned_step(n_cells=1000)
    assert plan.chunks[0].drafts == (50, 51, 52)
    tokens, positions, seq_ids, wants = plan.rows()
    assert tokens == [5, 50, 51, 52] and positions == [4, 5, 6, 7] and wants == [1, 1, 1, 1]
    assert plan.n_rows == 4
    out = OutputRows.of(plan, frozenset())
    assert out.sample_rows == [0] and out.drafted == {seq: (1, (50, 51, 52))}


@pytest.mark.pure
def test_no_drafts_where_the_kv_cache_has_no_room_for_them() -> None:
    _, plan = planned_step(n_cells=5)
    assert plan.chunks[0].drafts == ()


@pytest.mark.pure
def test_only_steps_whose_every_row_has_logits_time_a_draft_row() -> None:
    draft_rows = rows()
    for n in range(1, 9):  # a prompt's rows without logits are cheap: they say nothing of a draft's
        draft_rows.stepped(100 * n, 1, 10 + 0.1 * n)
    assert not draft_rows.cost.steps
    assert timed(draft_rows).cost.measured()


@pytest.mark.pure
def test_with_ignore_eos_and_nothing_waiting_only_the_sequences_with_most_left_save_a_step() -> None:
    scheduler = make_scheduler(n_cells=1000)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    seqs = [drafting(params, n_generated=g) for g in (3, 1, 1, 2)]
    plan = StepPlan(chunks=[Chunk(seq, 1) for seq in seqs])
    assert DraftRows.shares(plan, scheduler) == {0: 0.0, 1: 0.5, 2: 0.5, 3: 0.0}
    seqs[0].state.params = SamplingParams(max_tokens=32)  # one may end at any token: a share each
    assert DraftRows.shares(plan, scheduler) == {i: 0.25 for i in range(4)}


def test_a_fresh_tree_times_its_steps_then_probes_before_its_budget_decides(start_llm) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=5)
    prompt = "Copy the sentence exactly.\nSentence: The library opens in the spring, with a reading room.\nCopy:"
    greedy = dict(max_tokens=24, temperature=0, ignore_eos=True)
    plain = llm.ask(prompt, **greedy)  # a fresh tree's one-row steps, timed
    drafted = llm.ask(prompt, prediction=plain.text, **greedy)
    # the probes (three steps of four drafted rows) come whatever the host's load; what follows is
    # the measured budget's to decide
    stats = llm.stats()
    assert stats["draft_tokens"] >= 12 and stats["proposed_draft_tokens"] >= stats["draft_tokens"]
    if drafted.token_ids == plain.token_ids:
        assert drafted.usage.accepted_prediction_tokens >= 12
