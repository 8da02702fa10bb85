"""The overlapped loop's pure rules: when it is on, which steps it postprocesses first, which tokens
surely end their request, and how a step's rows and draws are split."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from llamactor.base.config import Config
from llamactor.native.engine import DecodeResult
from llamactor.native.sampling import Sampled
from llamactor.scheduling.sequence import Chunk, StepPlan
from llamactor.tree.output_rows import OutputRows
from llamactor.tree.overlapped_steps import ends_with, needs_postprocess_first, overlap_on, split_draw, without
from llamactor.tree.token_draw import Draw, StepResult

from tests.support.scheduling import make_seq

pytestmark = pytest.mark.pure

EOG = 99


class Tokens:
    def is_eog(self, token: int) -> bool:
        return token == EOG


def with_state(seq, *, max_tokens=None, ignore_eos=False, n_generated=0):
    seq.state = SimpleNamespace(params=SimpleNamespace(max_tokens=max_tokens, ignore_eos=ignore_eos),
                                n_generated=n_generated)
    return seq


def test_overlap_is_on_where_the_decode_is_asynchronous_unless_configured_and_never_batch_invariant() -> None:
    assert overlap_on(Config(), decodes_async=True) and not overlap_on(Config(), decodes_async=False)
    assert overlap_on(Config(overlap_steps=True), decodes_async=False)
    assert not overlap_on(Config(overlap_steps=False), decodes_async=True)
    assert not overlap_on(Config(overlap_steps=True, batch_invariant=True, flash_attn="on", n_ubatch=32,
                                 n_gpu_layers=0), decodes_async=True)


def step_result(rows: OutputRows, refused=(), failed=frozenset()) -> StepResult:
    return StepResult(DecodeResult(np.zeros((0, 4), np.float32), failed), rows, Draw(refused=list(refused)))


def test_steps_whose_next_plan_needs_their_postprocess_run_serially() -> None:
    seq = make_seq(3)
    plan = StepPlan(chunks=[Chunk(seq, 1)])
    assert not needs_postprocess_first(plan, step_result(OutputRows(sample_rows=[0], to_sample=[seq])))
    assert needs_postprocess_first(plan, step_result(OutputRows(scored=[(Chunk(seq, 1), 0)])))
    assert needs_postprocess_first(plan, step_result(OutputRows(label_rows=[(seq, 0)])))
    assert needs_postprocess_first(plan, step_result(OutputRows(), refused=[(seq, None)]))
    assert needs_postprocess_first(plan, step_result(OutputRows(), failed=frozenset({3})))
    prompt_only = make_seq(3)
    prompt_only.prompt_only = True
    assert needs_postprocess_first(StepPlan(chunks=[Chunk(prompt_only, 3)]), step_result(OutputRows()))


def test_eog_max_tokens_and_the_context_surely_end_a_request_a_stop_string_does_not() -> None:
    assert ends_with(with_state(make_seq(3)), EOG, Tokens(), 100)
    assert not ends_with(with_state(make_seq(3), ignore_eos=True), EOG, Tokens(), 100)
    assert ends_with(with_state(make_seq(3), max_tokens=5, n_generated=4), 7, Tokens(), 100)
    assert not ends_with(with_state(make_seq(3), max_tokens=5, n_generated=3), 7, Tokens(), 100)
    assert ends_with(with_state(make_seq(3)), 7, Tokens(), 4)
    assert not ends_with(with_state(make_seq(3)), 7, Tokens(), 5)


def test_rows_of_dropped_and_roomless_sequences_are_left_out_keeping_the_others_rows() -> None:
    a, b, c = make_seq(2, rid="a"), make_seq(2, rid="b"), make_seq(2, rid="c")
    c.seq_id = 7
    rows = OutputRows(sample_rows=[0, 1, 2], to_sample=[a, b, c])
    kept = without(rows, {a}, frozenset({7}))
    assert kept.sample_rows == [1] and kept.to_sample == [b]


def test_a_draw_splits_into_the_tokens_set_apart_and_the_rest_which_keeps_the_counts() -> None:
    a, b, c = make_seq(2, rid="a"), make_seq(2, rid="b"), make_seq(2, rid="c")
    draw = Draw([a, b, c], Sampled([1, 2, 3], [None, -0.5, None], [[], [(2, -0.5)], []]), n_in_graph=2)
    apart, rest = split_draw(draw, [False, True, False])
    assert apart.seqs == [b] and apart.sampled.tokens == [2] and apart.sampled.top == [[(2, -0.5)]]
    assert apart.n_in_graph == 0
    assert rest.seqs == [a, c] and rest.sampled.tokens == [1, 3] and rest.n_in_graph == 2
