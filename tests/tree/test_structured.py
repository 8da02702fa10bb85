"""Structured output on the real model: JSON Schema, JSON mode, grammars, regex, logit_bias.

Each constraint masks its own row inside the batched sampling step; these tests check the
output is valid, that bad constraints fail before anything is queued, and that an unconstrained
request decoded in the same steps is not affected.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import wait

import pytest

import llamactor
from llamactor import Grammar, InvalidRequestError

from tests.conftest import assert_equal_up_to_near_tie, record_sent
from tests.support.structured import PERSON_SCHEMA, Capital, valid_person

PROMPT = "User: What is the capital of France? Answer in JSON.\nAssistant:"


def test_a_pydantic_model_schema_gives_a_parsed_object(llm: llamactor.LLM) -> None:
    c = llm.ask(PROMPT, json_schema=Capital, temperature=0, max_tokens=64)
    assert c.finish_reason == "stop", c.text
    assert isinstance(c.parsed, Capital) and c.parse_error is None
    assert Capital.model_validate_json(c.text) == c.parsed


def test_sixteen_concurrent_schema_constrained_requests_all_validate(start_llm) -> None:
    llm = start_llm(n_parallel=16, n_ctx=4096)
    futures = [llm.submit(f"User: Describe person number {i} as JSON.\nAssistant:", json_schema=PERSON_SCHEMA,
                          temperature=0.9, seed=i, max_tokens=96) for i in range(16)]
    wait(futures, timeout=120)
    done = [f.result() for f in futures]
    assert all(c.finish_reason == "stop" for c in done), [c.text for c in done if c.finish_reason != "stop"]
    assert all(valid_person(c.text) for c in done), [c.text for c in done if not valid_person(c.text)]
    stats = llm.stats()
    assert stats["grammar_rows"] >= 16 * 5 and stats["steps"] < 16 * 40  # constrained rows share steps


def test_json_mode_output_is_a_json_object(llm: llamactor.LLM) -> None:
    c = llm.chat([{"role": "user", "content": "Describe Paris in JSON."}], grammar=Grammar.json_object(),
                 temperature=0.7, seed=3, max_tokens=64)
    assert c.finish_reason == "stop"
    assert isinstance(json.loads(c.text), dict)


def test_a_gbnf_grammar_and_a_regex_hold_the_output(llm: llamactor.LLM) -> None:
    choice = llm.ask("Is Paris in France? Answer:", grammar='root ::= " yes" | " no"', temperature=1.0, seed=1)
    assert choice.text in (" yes", " no") and choice.finish_reason == "stop"
    phone = llm.ask("Phone number:", grammar=Grammar.regex(r" \d{3}-\d{4}"), temperature=1.0, seed=2)
    assert re.fullmatch(r" \d{3}-\d{4}", phone.text)


@pytest.mark.parametrize("options", [
    {"json_schema": {"type": "objectx"}},
    {"json_schema": "{not json"},
    {"grammar": "root ::= undefined_rule"},
    {"grammar": "   "},
    {"grammar": "start: foo"},
    {"json_schema": PERSON_SCHEMA, "grammar": 'root ::= "x"'},
])
def test_a_bad_schema_or_grammar_is_refused_before_anything_is_queued(llm: llamactor.LLM, options: dict,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    sent = record_sent(llm, monkeypatch)
    with pytest.raises(InvalidRequestError):
        llm.submit("Hello", **options)
    assert sent == []  # refused on the caller's thread: no message reached the batcher
    assert llm.ask("Hello", max_tokens=1, ignore_eos=True).usage.completion_tokens == 1 and len(sent) == 1


def test_an_unconstrained_request_in_the_same_steps_is_not_affected(llm: llamactor.LLM, reference_engine) -> None:
    prompt = "The three primary colours are"
    alone = llm.ask(prompt, temperature=0, max_tokens=24)
    constrained = [llm.submit(PROMPT, json_schema=Capital, temperature=0.8, seed=i, max_tokens=48) for i in range(3)]
    together = llm.submit(prompt, temperature=0, max_tokens=24)
    wait(constrained + [together], timeout=60)
    prompt_tokens = reference_engine.tokenizer.tokenize(prompt)
    assert_equal_up_to_near_tie(reference_engine, prompt_tokens, alone, together.result())


def test_logit_bias_bans_the_greedy_choice_and_refuses_unknown_token_ids(llm: llamactor.LLM) -> None:
    first = llm.ask("The capital of France is", temperature=0, max_tokens=1)
    banned = llm.ask("The capital of France is", temperature=0, max_tokens=1, logit_bias={first.token_ids[0]: -100})
    assert banned.token_ids[0] != first.token_ids[0]
    with pytest.raises(InvalidRequestError):
        llm.ask("Hi", logit_bias={10**7: 5})
