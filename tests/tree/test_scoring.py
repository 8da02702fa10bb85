"""Prompt log-probabilities and ``score()`` on the real model, against llama-cpp-python's
``Llama(logits_all=True)`` (the comparison rule is in scoring_helpers)."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from llamactor.base.errors import InvalidRequestError

from tests.support.scoring import (EXACT, assert_close_in_a_batch, deltas, reference,  # noqa: F401 (fixture)
                                   reference_sums, task_choices)

LONG_TEXT = " ".join(f"Entry {i}: the {['red', 'blue', 'green'][i % 3]} box holds {i * 7 % 13} stones." for i in range(80))


def prompt_logprob_values(c: Any) -> list[float]:
    assert c.prompt_logprobs[0] is None
    return [e.logprob for e in c.prompt_logprobs[1:]]


@pytest.mark.timeout(300)  # f32 attention over a 600-token prompt, and the reference's own pass
def test_a_prompt_scored_alone_over_many_steps_equals_llama_cpp_python_beyond_the_sliding_window(
        start_llm: Any, reference: Any) -> None:
    llm = start_llm(flash_attn="off", score_rows_per_step=64, n_parallel=2)
    c = llm.ask(LONG_TEXT, max_tokens=0, prompt_logprobs=2)
    tokens = list(c.prompt_token_ids)
    assert len(tokens) > 600 and c.finish_reason == "length" and c.text == "" and c.usage.completion_tokens == 0
    expected, _ = reference.logprobs(tokens)
    assert float(deltas(prompt_logprob_values(c), expected).max()) <= EXACT
    for token, e in zip(tokens[1:], c.prompt_logprobs[1:]):
        assert e.token_id == token and len(e.top) == 2 and e.top[0][1] >= e.logprob
        assert (e.rank == 1) == (e.top_ids[0] == token or e.top[0][1] == e.logprob)
    stats = llm.stats()
    assert stats["prompt_rows_scored"] == len(tokens) - 1
    assert stats["steps"] >= (len(tokens) - 1) / 64  # the row budget spread the prompt over steps


@pytest.mark.timeout(300)
def test_prompts_scored_beside_generation_and_sharing_prefixes_agree_with_llama_cpp_python(
        start_llm: Any, reference: Any) -> None:
    llm = start_llm(flash_attn="off", score_rows_per_step=32, n_parallel=6, n_ctx=4096)
    generating = llm.submit("Once upon a time", max_tokens=48, temperature=0, ignore_eos=True)
    prompts = [LONG_TEXT[:k] for k in (300, 301, 1200)] + [LONG_TEXT[:2600]]
    futures = [llm.submit(p, max_tokens=0, prompt_logprobs=1) for p in prompts]
    for c in [f.result(timeout=300) for f in futures]:
        assert_close_in_a_batch(prompt_logprob_values(c), reference.logprobs(list(c.prompt_token_ids))[0])
    assert generating.result(timeout=300).usage.completion_tokens == 48
    # the prompts share their beginnings: later ones took those rows from the score cache
    assert llm.stats()["prompt_rows_from_cache"] > 0


def test_score_sums_each_continuation_computes_the_context_once_and_flags_greedy_ones(
        start_llm: Any, reference: Any) -> None:
    llm = start_llm(flash_attn="off", n_parallel=4)
    context = "Question: Which animal says moo and gives milk on the farm?\nAnswer:"
    continuations = [" The cow", " A dog", " Probably a large duck", " cow"]
    before = llm.stats()
    scores = llm.score(context, continuations)
    after = llm.stats()
    n_context = scores[0].n_context_tokens
    conts = [llm.tokenize(c, add_special=False).token_ids for c in continuations]
    assert [len(s.token_logprobs) for s in scores] == [len(c) for c in conts]
    # only the continuations' rows are computed (choices 2-4 take the context's from choice 1), but
    # each choice's context KV is computed again, not attached: a row is computed as alone
    assert after["prompt_rows_scored"] - before["prompt_rows_scored"] == sum(len(c) for c in conts)
    computed = after["prompt_tokens_computed"] - before["prompt_tokens_computed"]
    assert computed == sum(n_context + len(c) for c in conts)
    context_ids = list(llm.tokenize(context).token_ids)
    got, expected = [], []
    for score, cont in zip(scores, conts):
        values, margins = reference.logprobs(context_ids + list(cont))
        expected += values[n_context - 1:]
        got += score.token_logprobs
        assert score.logprob == pytest.approx(sum(score.token_logprobs))
        if all(abs(m) > 0.5 for m in margins[n_context - 1:]):  # no near-tie: greedy is unambiguous
            assert score.is_greedy == all(m > 0 for m in margins[n_context - 1:])
    assert_close_in_a_batch(got, expected)


def test_without_score_exact_a_continuation_attaches_its_cached_context(start_llm: Any) -> None:
    llm = start_llm(flash_attn="off", n_parallel=4, score_exact=False)
    context = "Question: Which animal says moo and gives milk on the farm?\nAnswer:"
    continuations = [" The cow", " A dog", " Probably a large duck", " cow"]
    before = llm.stats()
    scores = llm.score(context, continuations)
    computed = llm.stats()["prompt_tokens_computed"] - before["prompt_tokens_computed"]
    whole = sum(scores[0].n_context_tokens + len(s.token_logprobs) for s in scores)
    assert computed < whole  # the context's KV computed once and attached, not once per choice


@pytest.mark.timeout(300)
def test_lm_eval_shaped_choices_score_as_llama_cpp_python_alone_and_mostly_exactly_eight_at_a_time(
        start_llm: Any, reference: Any) -> None:
    # A choice shares its question with the choices before it; computed on that cached prefix it
    # would be computed in another shape than alone and part by ~0.07 nats (README, "Scoring prompts").
    llm = start_llm(flash_attn="off", n_parallel=8, n_ctx=4096)
    bos = llm.tokenize("Q").token_ids[0]
    choices = task_choices(lambda text: list(llm.tokenize(text, add_special=False).token_ids), bos)
    expected = reference_sums(reference, choices)
    one_at_a_time = [llm.score(context, [continuation])[0].logprob for context, continuation in choices]
    assert float(deltas(one_at_a_time, expected).max()) <= EXACT
    with concurrent.futures.ThreadPoolExecutor(8) as callers:  # as lm-eval's num_concurrent=8
        eight = list(callers.map(lambda c: llm.score(c[0], [c[1]])[0].logprob, choices))
    # beside each other a row still depends on its step's shape; alone in a step it is exact
    assert float(np.median(deltas(eight, expected))) <= EXACT
    assert_close_in_a_batch(eight, expected)


def test_token_ids_are_scored_as_given_with_no_bos_added(start_llm: Any) -> None:
    llm = start_llm(n_parallel=2)
    ids = list(llm.tokenize("The quick brown fox", add_special=False).token_ids)
    c = llm.ask(ids, max_tokens=0, prompt_logprobs=0)
    assert c.prompt_token_ids == tuple(ids) and len(c.prompt_logprobs) == len(ids)
    [score] = llm.score(ids[:2], [ids[2:]])
    assert score.n_context_tokens == 2 and len(score.token_logprobs) == len(ids) - 2


def test_echo_with_logprobs_reports_the_prompt_then_the_generated_tokens(start_llm: Any) -> None:
    llm = start_llm(n_parallel=2)
    c = llm.ask("The capital of France is", echo=True, logprobs=2, max_tokens=3, temperature=0, ignore_eos=True)
    assert len(c.prompt_logprobs) == len(c.prompt_token_ids) == c.usage.prompt_tokens
    assert all(len(e.top) == 2 for e in c.prompt_logprobs[1:]) and len(c.logprobs) == 3
    assert "".join(c.prompt_pieces) == "The capital of France is"  # the BOS adds no text


def test_bad_scoring_requests_fail_alone_with_a_clear_error(start_llm: Any) -> None:
    llm = start_llm(n_parallel=2)
    good = llm.submit_score("The sky is", [" blue"])
    bad = llm.submit_score("The sky is", [[10**7]])
    with pytest.raises(InvalidRequestError, match="token ids"):
        bad[0].result(timeout=60)
    assert good[0].result(timeout=60).logprob < 0
    for call in (lambda: llm.score("x", []), lambda: llm.score("x", [""]),
                 lambda: llm.ask("x", echo=True), lambda: llm.ask("x", prompt_logprobs=21)):
        with pytest.raises(InvalidRequestError):
            call()


def test_scoring_futures_can_be_awaited_and_cancelled(start_llm: Any) -> None:
    import asyncio

    llm = start_llm(n_parallel=2)
    scores = asyncio.run(llm.score_async("One, two,", [" three", " four"]))
    assert len(scores) == 2 and scores[0].logprob > scores[1].logprob
    futures = llm.submit_score(LONG_TEXT, [" end"])
    futures[0].cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        futures[0].result(timeout=60)


@pytest.mark.timeout(600)  # ~30 s alone: 400 decode steps, then the resumed prompt
def test_a_preempted_scoring_prompt_resumes_without_computing_a_row_twice(start_llm: Any, reference: Any) -> None:
    # A small cache: two high-priority generations grow beside a low-priority scoring prompt (which
    # advances one row a step beside them, its scoring share) until the least urgent sequence, the
    # scoring prompt, must give its cells back; it resumes once they are done.
    llm = start_llm(flash_attn="off", n_ctx=1024, n_parallel=3, score_rows_per_step=16)
    generating = [llm.submit(p, max_tokens=400, temperature=0, ignore_eos=True, priority="high")
                  for p in ("Once upon a time", "In a galaxy far away")]
    scored = llm.submit(LONG_TEXT[:1400], max_tokens=0, prompt_logprobs=1, priority="low")
    c = scored.result(timeout=600)
    assert [f.result(timeout=600).usage.completion_tokens for f in generating] == [400, 400]
    stats = llm.stats()
    assert stats["preemptions"] >= 1
    assert stats["prompt_rows_scored"] == len(c.prompt_token_ids) - 1
    assert_close_in_a_batch(prompt_logprob_values(c), reference.logprobs(list(c.prompt_token_ids))[0])


def test_neither_sampling_nor_scoring_loads_torch(model_path: str) -> None:
    # torch would be ~185 MiB of resident memory: sampling, logprobs and prompt scoring are numpy.
    code = (f"import sys, llamactor\n"
            f"with llamactor.start({model_path!r}, n_parallel=2, n_ctx=1024, n_threads=2) as llm:\n"
            f"    llm.ask('Once upon a time', max_tokens=4, temperature=0.8, top_k=0, top_logprobs=3, seed=1)\n"
            f"    llm.ask('Once upon a time', max_tokens=4, temperature=0.0, repeat_penalty=1.3, logprobs=True)\n"
            f"    print('torch' in sys.modules)\n"
            f"    llm.score('The sky is', [' blue', ' green'])\n"
            f"    print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
