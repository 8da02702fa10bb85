"""Label sequences (a rerank's documents) in the pure scheduler: their last prompt row is the one
output row, they wait to attach a shared prompt that a sibling computes (even a short one), and
beside other work their prompts are packed within the scoring share (the real engine:
tests/tree/test_label_scoring.py)."""

from __future__ import annotations

import pytest

from llamactor.scheduling.fairness import SCORE
from llamactor.scheduling.prompt_scores import ScoreState, logits_row_cost
from llamactor.scheduling.sequence import Chunk, Sequence, StepPlan
from llamactor.scheduling.step_packing import pack_step
from llamactor.scheduling.packed_kv import PackedPrefixIndex, PackedScheduler

from tests.support.scheduling import make_scheduler, make_seq

pytestmark = pytest.mark.pure

GROUPS = ((7,), (8, 9))


def label_seq(tokens: list[int], rid: str = "l", at: float = 0.0) -> Sequence:
    seq = make_seq(0, tokens=tokens, rid=rid, max_tokens=0, at=at)
    seq.prompt_only, seq.labels = True, GROUPS
    return seq


def test_a_label_sequence_is_scoring_work_and_prompt_only() -> None:
    assert label_seq([1, 2]).work_class == SCORE
    seq = make_seq(0, tokens=[1, 2])
    with pytest.raises(ValueError, match="prompt-only"):
        Sequence(request=seq.request, token_ids=[1, 2], n_prompt=2, labels=GROUPS)


def test_only_the_chunk_that_ends_its_prompt_flags_a_row_and_it_is_the_last() -> None:
    seq = label_seq(list(range(10, 20)))
    seq.seq_id = 0
    first = StepPlan(chunks=[Chunk(seq, 6)])
    assert not first.chunks[0].reads_labels and first.rows()[3] == [0] * 6
    seq.n_past = 6
    last = StepPlan(chunks=[Chunk(seq, 4)])
    tokens, positions, seq_ids, wants = last.rows()
    assert last.chunks[0].reads_labels and not last.chunks[0].samples
    assert (tokens, positions, wants) == ([16, 17, 18, 19], [6, 7, 8, 9], [0, 0, 0, 1])


def test_a_label_sequence_with_prompt_scores_gets_its_score_rows_then_its_label_row() -> None:
    seq = label_seq(list(range(10, 16)))
    seq.seq_id, seq.scoring = 1, ScoreState(start=1, n_prompt=6, n_top=1)
    chunk = Chunk(seq, 6, 0, 5)  # rows 0..4 predict tokens 1..5; row 5 is the label row
    assert StepPlan(chunks=[chunk]).rows()[3] == [1, 1, 1, 1, 1, 1]


def test_siblings_of_a_short_shared_prompt_wait_for_it_and_attach_it() -> None:
    # 10 shared tokens, under share_min_tokens (32): a label sequence still waits, since the
    # shared part is over an eighth of what it would compute (a rerank's judging prompt and query)
    s = make_scheduler(n_parallel=4, batch_size=3, n_batch=64)
    prompt = list(range(100, 110))
    docs = [label_seq(prompt + [200 + i, 300 + i], rid=f"d{i}") for i in range(3)]
    for seq in docs:
        s.add(seq)
    plan = s.schedule(now=0.0)
    assert [q.request_id for q in plan.admitted] == ["d0"]
    for chunk in plan.chunks:
        s.computed(chunk, 0.0)
    s.finish(docs[0], 0.0)  # prompt-only: done once its prompt is in KV
    plan = s.schedule(now=1.0)
    assert [q.request_id for q in plan.admitted] == ["d1", "d2"]
    assert [q.n_cached for q in plan.admitted] == [10, 10]
    assert sorted((c.seq.request_id, c.n_tokens, c.reads_labels) for c in plan.chunks) == [
        ("d1", 2, True), ("d2", 2, True)]


def test_a_label_sequence_does_not_wait_for_a_prefix_that_is_a_sliver_of_its_prompt() -> None:
    s = make_scheduler(n_parallel=4, batch_size=2, n_batch=512)
    for i in range(2):  # 10 shared tokens of 210: under an eighth, and under share_min_tokens
        s.add(label_seq(list(range(100, 110)) + list(range(1000 * (i + 1), 1000 * (i + 1) + 200)), rid=f"d{i}"))
    assert [q.request_id for q in s.schedule(now=0.0).admitted] == ["d0", "d1"]


def test_plain_requests_with_a_short_shared_prefix_still_do_not_wait() -> None:
    s = make_scheduler(n_parallel=4, batch_size=2, n_batch=64)
    for i in range(2):
        s.add(make_seq(0, tokens=list(range(100, 110)) + [200 + i, 300 + i], rid=f"p{i}"))
    assert [q.request_id for q in s.schedule(now=0.0).admitted] == ["p0", "p1"]


def test_beside_a_decode_label_prompts_get_the_scoring_share_and_alone_the_whole_budget() -> None:
    decoding = make_seq(0, tokens=[1, 2, 3])
    decoding.n_past = 2
    docs = [label_seq(list(range(40)), rid=f"d{i}") for i in range(3)]
    chunks = pack_step([decoding, *docs], n_batch=256, score_rows=64, score_share=1.0, order=lambda s: s.request_id)
    # the decode is 1 token + 2 for its row: a share of 1.0 lets the label prompts add 3 tokens
    assert [(c.seq.request_id, c.n_tokens) for c in chunks] == [("r", 1), ("d0", 3)]
    alone = pack_step(docs, n_batch=256, score_rows=64, score_share=1.0, order=lambda s: s.request_id)
    assert [(c.n_tokens, c.reads_labels) for c in alone] == [(40, True)] * 3


def test_a_label_row_counts_against_the_share_and_waits_for_room() -> None:
    decoding = [make_seq(0, tokens=[1, 2, 3], rid=f"g{i}") for i in range(2)]
    for seq in decoding:
        seq.n_past = 2
    doc = label_seq(list(range(8)), rid="d")
    doc.n_past = 3  # 5 tokens left: 5 + 2 for the row > the 6 units two decodes allow
    chunks = pack_step([*decoding, doc], n_batch=64, score_rows=64, score_share=1.0, order=lambda s: s.request_id)
    assert [(c.seq.request_id, c.n_tokens, c.reads_labels) for c in chunks][-1] == ("d", 4, False)


def test_the_share_counts_a_logits_row_as_the_models_own_cost() -> None:
    # Gemma 3 270M's 262k-wide head costs ~1.7 prompt tokens a row, SmolLM2-135M's 49k-wide ~0.27:
    # beside 8 decodes the share lets label prompts add a quarter of (8 + 8 rows' cost) tokens
    assert logits_row_cost(262_144, 640, 268_098_176) == pytest.approx(1.67, abs=0.01)
    assert logits_row_cost(49_152, 576, 134_515_008) == pytest.approx(0.27, abs=0.01)
    assert logits_row_cost(100, 10, 1_000) == 8.0 and logits_row_cost(10, 10, 10**9) == 0.1  # odd GGUFs: bounded
    decoding = [make_seq(0, tokens=[1, 2, 3], rid=f"g{i}") for i in range(8)]
    for seq in decoding:
        seq.n_past = 2
    doc = label_seq(list(range(40)), rid="d")
    for row_cost, added in ((2.0, 6), (0.27, 2)):
        chunks = pack_step([*decoding, doc], n_batch=256, score_rows=64, score_share=0.25,
                           order=lambda s: s.request_id, row_cost=row_cost)
        assert [(c.seq.request_id, c.n_tokens) for c in chunks][-1] == ("d", added)


def test_the_batch_invariant_scheduler_attaches_a_label_sequences_shared_prompt() -> None:
    s = PackedScheduler(n_parallel=4, n_batch=64, batch_size=2, batch_timeout_s=0.02, max_queue=8,
                        index=PackedPrefixIndex(n_seq_ids=8, n_cells=1000))
    prompt = list(range(100, 140))
    docs = [label_seq(prompt + [200 + i], rid=f"d{i}") for i in range(2)]
    for seq in docs:
        s.add(seq)
    plan = s.schedule(now=0.0)
    for chunk in plan.chunks:
        s.computed(chunk, 0.0)
    s.finish(docs[0], 0.0)
    plan = s.schedule(now=1.0)
    assert [(q.request_id, q.n_cached) for q in plan.admitted] == [("d1", 40)]
