"""The host-RAM tier's cost model (pure): an evicted entry is saved when the recomputation it is
expected to spare exceeds the save's cost; one-off prefixes stop being saved, prefixes that come
back keep being saved; saves stay within their share of the steps; calibration and observations
move the costs. And what the prefix index tells it: an entry's cell runs and whether it was reused.
The real engine's side is tests/tree/test_cache_tiers.py."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from llamactor.scheduling.kv_nodes import Match
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.tier_cost import (BURST_STEPS, Calibration, Displaced, SaveCandidate, TierCostModel,
                                            Verdict)

pytestmark = pytest.mark.pure

# A CPU-like device: saving is cheap next to recomputing; a GPU-like one: the other way round.
CPU = Calibration(range_ms=0.004, cell_ms=0.01, token_ms=2.0, step_ms=100.0)
GPU = Calibration(range_ms=0.05, cell_ms=0.001, token_ms=0.01, step_ms=16.0)


def candidate(n_cells: int = 200, n_runs: int = 1, returning: bool = False, n_leaving: int | None = None) -> SaveCandidate:
    return SaveCandidate(n_cells, n_runs, n_cells if n_leaving is None else n_leaving, returning)


def test_a_long_prefix_is_saved_when_recomputing_it_costs_more_than_saving() -> None:
    model = TierCostModel(CPU)
    decision = model.decide(candidate(200))
    assert decision.save and decision.gain_ms > decision.cost_ms
    assert decision.cost_ms == pytest.approx(0.004 + 200 * 0.01)


def test_on_a_gpu_a_fragmented_fresh_answer_is_not_worth_saving_but_a_contiguous_prompt_is() -> None:
    model = TierCostModel(GPU)
    fragmented = model.decide(candidate(64, n_runs=64))  # cells interleaved with 63 other sequences'
    assert fragmented.verdict is Verdict.NOT_WORTH and fragmented.cost_ms > fragmented.gain_ms
    assert model.decide(candidate(2000, n_runs=2)).save


def test_one_off_prefixes_stop_being_saved_while_returning_ones_still_are() -> None:
    model = TierCostModel(CPU)
    verdicts = [model.decide(candidate(60, n_runs=30)).verdict for _ in range(60)]  # nothing ever comes back
    assert verdicts[0] is Verdict.SAVE
    assert set(verdicts[-20:]) == {Verdict.NOT_WORTH}
    assert model.counts["saves_skipped"] >= 20
    assert model.decide(candidate(60, n_runs=30, returning=True)).save  # its class has its own evidence


def test_prefixes_that_come_back_keep_their_class_worth_saving() -> None:
    model = TierCostModel(CPU)
    for _ in range(200):
        assert model.decide(candidate(60, n_runs=30)).save
        model.reused(returning=False)  # each saved entry is restored once
        model.stepped(8, 100.0)
    assert model.reuse["fresh"].p == pytest.approx(1.0)


def test_ghost_hits_bring_a_class_back_after_it_stopped_being_saved() -> None:
    model = TierCostModel(CPU)
    for _ in range(60):
        model.decide(candidate(60, n_runs=30))
    assert not model.decide(candidate(60, n_runs=30)).save
    for _ in range(3):  # skipped entries' prefixes asked for again: the traffic changed
        model.ghost_hit(returning=False)
    assert model.decide(candidate(60, n_runs=30)).save and model.counts["ghost_hits"] == 3


def test_only_the_cells_leaving_count_as_the_gain_of_a_trimmed_entry() -> None:
    model = TierCostModel(GPU)
    assert model.decide(candidate(2000, n_runs=2)).save
    assert not model.decide(candidate(2000, n_runs=2, n_leaving=1)).save


def test_saves_take_at_most_their_share_of_the_steps() -> None:
    # recomputing is dear: every save pays, whatever the reuse estimate has come down to
    model = TierCostModel(Calibration(range_ms=1.0, cell_ms=0.0, token_ms=1e6, step_ms=100.0), step_share=0.25)
    # the credit starts at BURST_STEPS steps' share: 100 ms, i.e. 10 saves of 10 ms
    verdicts = [model.decide(candidate(50, n_runs=10)).verdict for _ in range(12)]
    assert verdicts == [Verdict.SAVE] * 10 + [Verdict.OVER_BUDGET] * 2
    model.stepped(n_rows=8, ms=100.0)  # a step of 100 ms gives 25 ms
    assert [model.decide(candidate(50, n_runs=10)).verdict for _ in range(3)] == [Verdict.SAVE] * 2 + [Verdict.OVER_BUDGET]
    assert model.counts["saves_over_budget"] == 3


@given(st.lists(st.tuples(st.floats(1, 200), st.integers(1, 100), st.integers(1, 100)), min_size=1, max_size=60))
def test_over_any_run_saves_take_no_more_than_their_share_plus_one_burst(steps: list[tuple[float, int, int]]) -> None:
    model = TierCostModel(Calibration(range_ms=0.5, cell_ms=0.05, token_ms=10.0, step_ms=50.0), step_share=0.2)
    spent = granted = excess = 0.0
    burst = BURST_STEPS * 0.2 * 50.0
    for step_ms, n_cells, n_runs in steps:
        c = candidate(max(n_cells, n_runs), n_runs=n_runs)
        decision = model.decide(c)
        if decision.save:
            model.saved(decision, c, decision.cost_ms * 1.5)  # slower than predicted
            spent += decision.cost_ms * 1.5
            excess = max(excess, decision.cost_ms * 0.5)
        model.stepped(8, step_ms)
        granted += 0.2 * step_ms
        # the credit may go below 0 by one save's misprediction, never further
        assert spent <= granted + burst + excess + 1e-6


def test_observed_saves_and_steps_refine_the_calibration() -> None:
    model = TierCostModel(CPU)
    c = candidate(100, n_runs=10)
    before = model.save_cost_ms(c)
    for _ in range(50):
        d = model.decide(c)
        model.saved(d, c, before * 3)  # this device saves 3× slower than the start measured
        model.stepped(64, 640.0)  # 10 ms a prefilled token, not 2
    assert model.save_cost_ms(c) == pytest.approx(before * 3, rel=0.05)
    assert model.token_ms == pytest.approx(10.0, rel=0.05)
    model.stepped(4, 1000.0)  # a small step is a decode's fixed cost, not a prefill rate
    assert model.token_ms == pytest.approx(10.0, rel=0.05)


def test_calibration_from_two_saves_separates_the_run_and_the_cell_costs() -> None:
    cal = Calibration.from_saves((8, 8, 8 * 0.5 + 8 * 0.1), (1, 16, 0.5 + 16 * 0.1), (32, 64.0))
    assert (cal.range_ms, cal.cell_ms, cal.token_ms, cal.step_ms) == pytest.approx((0.5, 0.1, 2.0, 64.0))
    noisy = Calibration.from_saves((8, 8, 0.1), (1, 16, 5.0), (32, 64.0))  # the fragmented save came out faster
    assert noisy.range_ms >= 0 and noisy.cell_ms >= 0


def test_a_bad_candidate_or_share_is_refused() -> None:
    for bad in [lambda: SaveCandidate(0, 1, 0, False), lambda: SaveCandidate(4, 5, 4, False),
                lambda: SaveCandidate(4, 1, 5, False), lambda: TierCostModel(CPU, step_share=0)]:
        with pytest.raises(ValueError):
            bad()


# -- what the prefix index offers ---------------------------------------------------------------

def test_an_entry_decoded_among_others_is_offered_with_a_run_per_step() -> None:
    index = PrefixIndex(n_seq_ids=4, n_cells=1000, offer_evicted=True)
    a, _ = index.allocate()
    b, _ = index.allocate()
    index.extend(a, list(range(20)), 0.0)  # a prompt in one step: one run
    for t in range(10):  # then a and b decode together: their cells alternate
        index.extend(a, [100 + t], 1.0 + t)
        index.extend(b, [200 + t], 1.0 + t)
    index.finish(a, 20.0, keep=True)
    c, _ = index.allocate()
    index.extend(c, list(range(500, 510)), 21.0)
    for t in range(5):  # c decodes alone: its cells follow one another
        index.extend(c, [600 + t], 22.0 + t)
    index.finish(c, 30.0, keep=True)
    ops = {op.seq_id: op for op in index.flush()}
    # the prompt and a's first token are one run (b's first token came after both), then one a token
    assert (ops[a].runs, ops[a].returning) == (10, False)
    assert (ops[c].runs, ops[c].returning) == (1, False)


def test_an_entry_whose_prefix_was_attached_again_is_offered_as_returning() -> None:
    index = PrefixIndex(n_seq_ids=4, n_cells=1000, offer_evicted=True)
    system, _ = index.allocate(None)
    index.extend(system, [1, 2, 3], 0.0)
    index.pin(system)  # the operator's system prompt: attaching it is no sign of reuse
    first, _ = index.allocate()
    index.attach(first, index.lookup([1, 2, 3, 4]), 1.0)
    index.extend(first, [4, 5, 6], 1.0)
    index.finish(first, 2.0, keep=True)
    assert not next(op for op in index.flush() if op.seq_id == first).returning

    turn1, _ = index.allocate()
    index.extend(turn1, [7, 8, 9], 3.0)
    index.finish(turn1, 4.0, keep=True)
    turn2, _ = index.allocate()
    index.attach(turn2, Match(3, turn1), 5.0)  # the conversation came back
    index.extend(turn2, [10, 11], 5.0)
    index.finish(turn2, 6.0, keep=True)  # its entry holds turn1's cells
    assert not next(op for op in index.flush() if op.seq_id == turn2).returning  # 3 tokens: any prompt's opening

    turn1, _ = index.allocate()
    index.extend(turn1, list(range(100, 120)), 7.0)
    index.finish(turn1, 8.0, keep=True)
    other, _ = index.allocate()  # a prompt sharing only the opening of the conversation's cells
    index.attach(other, Match(2, turn1), 9.0)
    index.extend(other, [50, 51, 52], 9.0)
    index.finish(other, 10.0, keep=True)
    turn2, _ = index.allocate()
    index.attach(turn2, Match(20, turn1), 11.0)  # the conversation came back: the opening is reused too
    index.extend(turn2, [10, 11], 11.0)
    index.finish(turn2, 12.0, keep=True)
    ops = {op.seq_id: op for op in index.flush()}
    assert ops[turn2].returning and not ops[other].returning


def test_a_restored_entry_is_offered_as_returning() -> None:
    index = PrefixIndex(n_seq_ids=4, n_cells=1000, offer_evicted=True)
    seq, _ = index.allocate()
    index.restored(seq, list(range(1, 21)), 0.0)
    index.extend(seq, [5], 1.0)
    index.finish(seq, 2.0, keep=True)
    assert index.flush()[0].returning


def test_the_price_of_letting_an_entry_go_is_its_recomputation_or_its_save_and_likely_restore() -> None:
    model = TierCostModel(GPU)
    fragmented = candidate(64, n_runs=64)  # not worth saving: its price is the expected recomputation
    assert model.price_ms(fragmented) == pytest.approx(model.gain_ms(fragmented))
    contiguous = candidate(2000, n_runs=2, returning=True)  # worth it: the save, and a restore at p
    save = model.save_cost_ms(contiguous)
    assert model.price_ms(contiguous) == pytest.approx(save * (1 + model.reuse["returning"].p))
    model.credit_ms = save / 2  # the steps' share cannot take it now: no price, it waits
    assert model.price_ms(contiguous) is None
    assert model.counts == {"saves_skipped": 0, "saves_over_budget": 0, "ghost_hits": 0}  # a price decides nothing


def test_letting_go_into_a_full_tier_also_costs_the_recomputation_of_what_it_pushes_out() -> None:
    model = TierCostModel(CPU)
    c = candidate(200)
    free = model.price_ms(c)
    assert free is not None and model.price_ms(c, Displaced(room_tokens=500)) == pytest.approx(free)
    pushing = model.price_ms(c, Displaced(room_tokens=50, returning=True))  # 150 tokens of a conversation go
    assert pushing == pytest.approx(free + model.reuse["returning"].p * 150 * CPU.token_ms)
