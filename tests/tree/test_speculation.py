"""Drafted tokens verified in the batched step (docs/architecture.md, *Speculation*), on the real
model: the output is the one decoding without drafts gives (token ids, up to the suite's
near-tie rule: a drafted step computes its rows in another batch shape), the drafts a prediction
makes are accepted where the model agrees, and everything a token goes through -- grammars, stop
strings, max_tokens, streaming, restarts, the prefix cache -- holds for a drafted run.

What a step drafts is the budget's decision, measured from step times (``draft_budget``, tested
model-free): on a loaded host it may draft little, so these tests of the verification grant every
proposal the step has room for (test_draft_rows.py runs the budget itself on a fresh tree)."""

from __future__ import annotations

import pytest

import llamactor
import llamactor.tree.draft_rows
from llamactor.base.errors import EngineError
from llamactor.scheduling.draft_budget import DraftWish, StepCost
from llamactor.tree.draft_verify import DraftVerifier

from tests.conftest import assert_equal_up_to_near_tie, audit_kv
from tests.support.structured import PERSON_SCHEMA, valid_person

# A copy: the model's greedy answer repeats the passage with wide margins (no near-tie to part
# runs computed in different batch shapes), as an editor's predicted output would.
PASSAGE = ("The committee approved the budget for the new public library on Tuesday evening. Construction "
           "will begin in the spring, and the building should open to readers before the end of next year, "
           "with a reading room, a children's corner and a small cafe on the ground floor.")
PROMPT = f"Copy the passage exactly.\nPassage: {PASSAGE}\nCopy:"
GREEDY = dict(max_tokens=48, temperature=0, ignore_eos=True)


def every_proposal(wishes: list[DraftWish], n_rows: int, room: int, cost: StepCost) -> list[int]:
    """A budget that grants each proposal what the step's room leaves, in order."""
    granted = []
    for wish in wishes:
        granted.append(max(0, min(wish.n_proposed, room)))
        room -= granted[-1]
    return granted


@pytest.fixture(autouse=True)
def drafts_granted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamactor.tree.draft_rows, "plan_drafts", every_proposal)


@pytest.fixture(scope="module")
def plain(llm: llamactor.LLM) -> llamactor.Completion:
    """The prompt's greedy answer without drafts."""
    return llm.ask(PROMPT, **GREEDY)


def prompt_ids(engine: object) -> list[int]:
    return engine.tokenizer.tokenize(PROMPT)  # type: ignore[attr-defined]


def test_a_prediction_that_is_the_answer_is_accepted_and_changes_no_token(llm, plain, reference_engine) -> None:
    before = llm.stats()
    drafted = llm.ask(PROMPT, prediction=plain.text, **GREEDY)
    assert_equal_up_to_near_tie(reference_engine, prompt_ids(reference_engine), plain, drafted)
    usage = drafted.usage
    assert usage.completion_tokens == 48 and drafted.finish_reason == "length"
    if drafted.token_ids == plain.token_ids:  # the prediction holds throughout: most tokens came as drafts
        assert usage.accepted_prediction_tokens >= 30 and usage.rejected_prediction_tokens == 0
    after = llm.stats()
    n_drafted = after["draft_tokens"] - before["draft_tokens"]
    assert n_drafted == usage.accepted_prediction_tokens + usage.rejected_prediction_tokens
    assert after["accepted_draft_tokens"] - before["accepted_draft_tokens"] == usage.accepted_prediction_tokens
    assert audit_kv(llm) == []  # accepted cells in the index, rejected ones gone from llama.cpp


def test_a_prediction_that_never_matches_changes_nothing_and_counts_its_rejections(
        llm, plain, reference_engine) -> None:
    drafted = llm.ask(PROMPT, prediction="zebra quartz " * 40, **GREEDY)
    assert_equal_up_to_near_tie(reference_engine, prompt_ids(reference_engine), plain, drafted)
    assert drafted.usage.accepted_prediction_tokens == 0 < drafted.usage.rejected_prediction_tokens
    assert audit_kv(llm) == []


def test_a_prediction_with_an_edit_is_accepted_around_it(llm, plain, reference_engine) -> None:
    words = plain.text.split(" ")
    middle = len(words) // 2
    edited = " ".join([*words[:middle], "Pluto-and-friends", *words[middle + 1:]])
    drafted = llm.ask(PROMPT, prediction=edited, **GREEDY)
    assert_equal_up_to_near_tie(reference_engine, prompt_ids(reference_engine), plain, drafted)
    if drafted.token_ids == plain.token_ids:
        assert drafted.usage.accepted_prediction_tokens > 0 and drafted.usage.rejected_prediction_tokens > 0


def test_seeded_sampling_with_a_prediction_draws_what_the_seed_draws_without_one(llm) -> None:
    sampled = dict(max_tokens=32, temperature=0.7, seed=11, ignore_eos=True)
    alone = llm.ask(PROMPT, **sampled)
    drafted = llm.ask(PROMPT, prediction=alone.text, **sampled)
    # The generator is drawn once per token either way (the exact rule: test_draft_verify). A
    # drafted step computes its rows in another batch shape, which moves this CPU build's logits
    # by up to ~1 (conftest's NEAR_TIE): a sampled run could part where a draw falls between a
    # boundary's two positions; the copy's distributions are peaked enough that none does here.
    assert drafted.token_ids == alone.token_ids
    assert drafted.usage.accepted_prediction_tokens >= 24 and drafted.usage.rejected_prediction_tokens == 0


def test_drafts_never_run_past_max_tokens(llm, plain) -> None:
    drafted = llm.ask(PROMPT, prediction=plain.text, max_tokens=5, temperature=0, ignore_eos=True)
    assert drafted.usage.completion_tokens == 5 and drafted.finish_reason == "length"
    assert drafted.usage.accepted_prediction_tokens <= 4
    assert audit_kv(llm) == []


def test_a_stop_string_inside_an_accepted_run_ends_the_answer_there(llm, plain) -> None:
    stop = plain.text.split()[4]  # a few tokens in: inside the first run of drafts
    cut = llm.ask(PROMPT, stop=[stop], **GREEDY)
    drafted = llm.ask(PROMPT, stop=[stop], prediction=plain.text, **GREEDY)
    assert drafted.finish_reason == cut.finish_reason == "stop" and drafted.stop_sequence == stop
    assert drafted.text == cut.text == plain.text[:plain.text.index(stop)]
    assert drafted.usage.accepted_prediction_tokens > 0
    assert drafted.usage.completion_tokens == cut.usage.completion_tokens
    assert audit_kv(llm) == []


def test_a_grammar_constrained_answer_is_the_same_with_its_prediction(llm) -> None:
    prompt = "User: Describe a person as JSON.\nAssistant:"
    plain = llm.ask(prompt, json_schema=PERSON_SCHEMA, temperature=0, max_tokens=80)
    drafted = llm.ask(prompt, json_schema=PERSON_SCHEMA, temperature=0, max_tokens=80, prediction=plain.text)
    refused = llm.ask(prompt, json_schema=PERSON_SCHEMA, temperature=0, max_tokens=80,
                      prediction="this is not JSON at all, " * 8)
    assert valid_person(plain.text)
    assert drafted.text == plain.text == refused.text
    assert drafted.usage.accepted_prediction_tokens > 0
    assert refused.usage.accepted_prediction_tokens == 0


def test_streamed_pieces_of_a_drafted_answer_are_its_text(llm, plain) -> None:
    stream = llm.stream(PROMPT, prediction=plain.text, **GREEDY)
    pieces = list(stream)
    assert "".join(pieces) == stream.completion.text
    assert stream.completion.usage.accepted_prediction_tokens > 0


def test_a_crash_in_the_middle_of_a_drafted_run_resumes_with_the_accepted_tokens_only(
        start_llm, monkeypatch, reference_engine) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=5)
    plain = llm.ask(PROMPT, **GREEDY)
    draw = DraftVerifier._draw
    calls = {"n": 0}

    def crash_on_the_fifth_draft(self, seq, row):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:  # some of this run's tokens are accepted and streamed already
            raise EngineError("injected in the middle of a drafted run")
        return draw(self, seq, row)

    monkeypatch.setattr(DraftVerifier, "_draw", crash_on_the_fifth_draft)
    stream = llm.stream(PROMPT, prediction=plain.text, **GREEDY)
    pieces = list(stream)
    resumed = stream.completion
    assert calls["n"] > 5 and llm.stats()["restarts"] == 1
    assert "".join(pieces) == resumed.text  # each piece once: the drafted rows were never checkpointed
    assert resumed.usage.completion_tokens == len(resumed.token_ids) == 48
    # Each draw follows an accepted draft (the crashed batcher's five too: the checkpoint carries
    # their count), and a run may end on an accepted draft without one.
    assert calls["n"] <= resumed.usage.accepted_prediction_tokens <= calls["n"] + 1
    assert_equal_up_to_near_tie(reference_engine, prompt_ids(reference_engine), plain, resumed)
    assert audit_kv(llm) == []


def test_a_prefix_cached_after_drafted_runs_gives_a_later_request_the_cold_answer(
        start_llm, reference_engine) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=5)
    plain = llm.ask(PROMPT, **GREEDY)
    llm.ask(PROMPT, prediction="zebra quartz " * 40, **GREEDY)  # all rejected: no cell of theirs may stay
    drafted = llm.ask(PROMPT, prediction=plain.text, **GREEDY)  # its cells: accepted drafts
    assert drafted.usage.accepted_prediction_tokens > 0
    assert audit_kv(llm) == []
    longer = PROMPT + drafted.text[:len(drafted.text) // 2]
    again = llm.ask(longer, **GREEDY)
    assert again.usage.cached_tokens > len(prompt_ids(reference_engine))  # it reused drafted cells
    cold = start_llm(n_parallel=1, prefix_cache=False).ask(longer, **GREEDY)
    assert_equal_up_to_near_tie(reference_engine, reference_engine.tokenizer.tokenize(longer), cold, again)


def test_ngram_drafts_copy_from_the_prompt_and_change_no_token(llm, plain, reference_engine) -> None:
    drafted = llm.ask(PROMPT, speculation="ngram", **GREEDY)
    assert_equal_up_to_near_tie(reference_engine, prompt_ids(reference_engine), plain, drafted)
    assert drafted.usage.accepted_prediction_tokens >= 16  # the passage is in the prompt
    assert audit_kv(llm) == []


def test_a_model_without_sliding_window_layers_verifies_drafts_alike(start_llm, instruct_path) -> None:
    llm = start_llm(instruct_path, n_parallel=2, batch_timeout_ms=5)
    plain = llm.ask(PROMPT, **GREEDY)
    drafted = llm.ask(PROMPT, prediction=plain.text, **GREEDY)
    ngram = llm.ask(PROMPT, speculation="ngram", **GREEDY)
    assert drafted.token_ids == plain.token_ids == ngram.token_ids  # a copy: margins far from any tie
    assert drafted.usage.accepted_prediction_tokens >= 30 and ngram.usage.accepted_prediction_tokens > 0
    assert audit_kv(llm) == []

