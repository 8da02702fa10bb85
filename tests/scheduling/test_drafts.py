"""Drafters, model-free (``llamactor.scheduling.drafts``): a prediction drafts what follows the
output in it and re-anchors after an edit; n-gram lookup proposes the continuation of the latest
earlier occurrence of the longest recurring suffix, from an index kept as tokens arrive; drafters
whose drafts keep failing rest, and their acceptance estimate follows what the steps accept.
Property-tested against a plain rescan and a simulated verifier. The engine's side (drafts verified
in the step, outputs identical) is tested with the real model beside the batcher."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamactor.scheduling.drafts import (FAIL_STREAK, FIRST_REST, NGRAM_PRIOR, PREDICTION_PRIOR, Adaptivity,
                                         NgramDrafter, PredictionDrafter, make_drafter)

pytestmark = pytest.mark.pure

PROMPT = [900, 901, 902]  # a prompt the drafters must see past (n_prompt)


def generate(drafter: PredictionDrafter | NgramDrafter, target: list[int], k: int = 8,
             prompt: list[int] = PROMPT) -> tuple[int, int]:
    """Decode ``target`` after ``prompt`` as the engine would with drafts verified greedily against
    it: each step emits the accepted drafts and one sampled token. Returns (steps, accepted)."""
    out: list[int] = []
    steps = accepted_total = 0
    while len(out) < len(target):
        draft = drafter.propose(prompt + out, len(prompt), k)
        assert len(draft) <= k
        accepted = 0
        while accepted < len(draft) and len(out) + accepted < len(target) and draft[accepted] == target[len(out) + accepted]:
            accepted += 1
        drafter.observe(len(draft), accepted)
        out += target[len(out):len(out) + accepted + 1]
        steps += 1
        accepted_total += accepted
    assert out == target
    return steps, accepted_total


def test_make_drafter_picks_the_prediction_then_ngram_then_none() -> None:
    assert isinstance(make_drafter("off", [1, 2, 3]), PredictionDrafter)
    assert isinstance(make_drafter("ngram", [1, 2, 3]), PredictionDrafter)
    assert isinstance(make_drafter("ngram", None), NgramDrafter)
    assert make_drafter("off", None) is None
    assert make_drafter("off", []) is None  # an empty prediction drafts nothing


def test_an_exact_prediction_drafts_all_of_itself_in_runs_of_k() -> None:
    prediction = list(range(100, 400))
    drafter = PredictionDrafter(prediction)
    assert drafter.propose(PROMPT, len(PROMPT), 5) == [100, 101, 102, 103, 104]
    steps, accepted = generate(PredictionDrafter(prediction), prediction, k=16)
    assert steps == 18 and accepted == 300 - 17  # 17 steps of 16 + 1 tokens, the last 11 drafts only


def test_after_a_small_edit_the_rest_of_the_prediction_still_drafts() -> None:
    prediction = list(range(100, 400))
    for edited in (prediction[:150] + [7, 8] + prediction[152:],   # two tokens replaced
                   prediction[:150] + [7, 8, 9] + prediction[150:],  # three inserted
                   prediction[:150] + prediction[160:],             # ten deleted
                   prediction[:150] + [7] + prediction[155:]):       # re-tokenized differently
        steps, accepted = generate(PredictionDrafter(prediction), edited, k=16)
        assert steps <= 2 * (-(-len(edited) // 17)) + 3, (steps, len(edited))
        assert accepted >= len(edited) - 30


def test_a_suffix_found_far_from_where_the_output_left_needs_three_tokens() -> None:
    line = [50, 51, 52, 53, 54]
    filler = list(range(200, 240))
    prediction = line + [1, 2, 3] + filler + line + [60, 61, 62]
    drafter = PredictionDrafter(prediction)
    output = line + [1, 2, 3, 99, 54]  # left at position 8; a lone 54 only occurs far from there
    assert drafter.propose(PROMPT + output, len(PROMPT), 4) == []
    output += [52, 53, 54]  # three tokens of the line: the one after where the output left
    assert drafter.propose(PROMPT + output, len(PROMPT), 4) == [60, 61, 62]


def test_the_output_rejoins_the_nearest_repeat_after_where_it_left() -> None:
    line = [50, 51, 52, 53, 54]
    prediction = line + [1, 2, 3] + line + [4, 5, 6] + line + [7, 8, 9]
    drafter = PredictionDrafter(prediction)
    output = line + [1, 2, 3] + [99] + line  # an inserted token, then the second line
    assert drafter.propose(PROMPT + output, len(PROMPT), 3) == [4, 5, 6]


def test_a_prediction_the_output_never_matches_drafts_little_and_rests() -> None:
    drafter = PredictionDrafter(list(range(100, 200)))
    steps, accepted = generate(drafter, list(range(500, 800)), k=8)
    assert accepted == 0 and steps == 300
    assert drafter.acceptance < PREDICTION_PRIOR


def naive_lookup(tokens: list[int], k: int, sizes: range) -> list[int]:
    """The n-gram rule by rescanning: the longest suffix with an earlier occurrence, its latest one."""
    n = len(tokens)
    for size in sizes:
        if size > n:
            continue
        suffix = tokens[n - size:]
        for end in range(n - 1, size - 1, -1):
            if tokens[end - size:end] == suffix:
                return tokens[end:min(end + k, n)]
    return []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=80), st.integers(1, 4), st.integers(1, 4), st.integers(1, 9))
def test_ngram_lookup_is_the_rescan_rule_as_tokens_arrive(tokens: list[int], low: int, extra: int, k: int) -> None:
    drafter = NgramDrafter(max_ngram=low + extra - 1, min_ngram=low)
    for length in range(0, len(tokens) + 1, 3):  # a few tokens arrive per step
        assert drafter.propose(tokens[:length], 0, k) == naive_lookup(tokens[:length], k, drafter.sizes)


def test_ngram_drafts_a_quoted_passage_after_a_few_tokens_of_it() -> None:
    passage = list(range(1000, 1100))
    prompt = [5, 6, 7] + passage + [8, 9]
    answer = [11, 12] + passage[:60] + [13, 14]
    steps, accepted = generate(NgramDrafter(), answer, k=8, prompt=prompt)
    assert accepted >= 50 and steps < len(answer) / 2


def test_ngram_lookup_stays_fast_on_long_sequences() -> None:
    tokens = [(i * 7919) % 5000 for i in range(8192)]
    drafter = NgramDrafter()
    drafter.propose(tokens[:8000], 8000, 16)
    start = time.perf_counter()
    for length in range(8001, 8192):
        drafter.propose(tokens[:length], 8000, 16)
    assert (time.perf_counter() - start) / 191 < 0.002  # per step, slicing the list included


def test_a_restarted_sequence_is_looked_up_from_its_new_tokens() -> None:
    drafter = NgramDrafter(max_ngram=2, min_ngram=1)
    assert drafter.propose([1, 2, 3, 1, 2], 0, 4) == [3, 1, 2]
    assert drafter.propose([4, 4], 0, 4) == [4]  # shorter than before: nothing of the old index


def test_failing_drafts_rest_for_growing_spells_and_a_good_probe_resumes() -> None:
    adapt = Adaptivity(NGRAM_PRIOR)
    for _ in range(FAIL_STREAK):
        assert not adapt.resting()
        adapt.observe(4, 0)
    assert [adapt.resting() for _ in range(FIRST_REST + 1)] == [True] * FIRST_REST + [False]
    adapt.observe(4, 0)  # the probe failed: twice as long
    assert [adapt.resting() for _ in range(2 * FIRST_REST + 1)] == [True] * 2 * FIRST_REST + [False]
    assert adapt.unproven  # nothing accepted yet: the budget judges its first row hopefully
    adapt.observe(4, 2)  # a probe that pays: drafting resumes, the next rest as short as the first
    assert not adapt.unproven
    for _ in range(FAIL_STREAK):
        assert not adapt.resting()
        adapt.observe(4, 0)
    assert sum(adapt.resting() for _ in range(4 * FIRST_REST)) == FIRST_REST


def test_nothing_verified_is_nothing_learned() -> None:
    adapt = Adaptivity(0.7)
    for _ in range(10):
        adapt.observe(0, 0)
    assert adapt.acceptance == pytest.approx(0.7) and not adapt.resting() and adapt.unproven
    with pytest.raises(ValueError):
        adapt.observe(2, 3)


@settings(max_examples=100, deadline=None)
@given(st.floats(0.05, 0.95), st.integers(0, 2**32 - 1))
def test_the_acceptance_estimate_finds_the_per_token_chance(p: float, seed: int) -> None:
    import random
    rng = random.Random(seed)
    adapt = Adaptivity(0.5)
    estimates = []
    for _ in range(400):
        drafted, accepted = 8, 0
        while accepted < drafted and rng.random() < p:
            accepted += 1
        adapt.observe(drafted, accepted)
        estimates.append(adapt.acceptance)
    mean = sum(estimates[100:]) / 300
    assert abs(mean - p) < 0.1
    assert all(0.0 <= e <= 1.0 for e in estimates)
