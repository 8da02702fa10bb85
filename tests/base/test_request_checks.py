"""Validation at the edge, model-free: what the typed requests, the sampling parameters, the
grammars and the tokenizer routes' plans refuse before anything is queued -- each a 400
(``InvalidRequestError``) that says what and where -- and the stop strings' linear matching."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.base.embedding_request import EmbeddingRequest
from llamactor.base.request import GenerationRequest
from llamactor.base.request_checks import MAX_MESSAGES, check_text
from llamactor.dialects.tokenizer import ApplyTemplateRequest, TokenizeRequest, apply_template_call, tokenize_call
from llamactor.tree.text import TextAssembler

pytestmark = pytest.mark.pure

DEFAULTS = SamplingParams()
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
LONE = "\ud800"


def refused(match: str, **build: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError, match=match) as caught:
        GenerationRequest.build(DEFAULTS, **build)
    return caught.value


# -- seeds ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [-1, -2, -(2**32), 0xFFFFFFFF * -1, -(2**63)])
def test_a_negative_seed_means_a_random_one_as_in_llama_server_and_ollama(seed: int) -> None:
    request = GenerationRequest.build(DEFAULTS, prompt="hi", seed=seed, n=2)
    assert request.params.seed is None
    assert [m.params.seed for m in request.generate_messages("r", [None, None], 0.0)] == [None, None]  # type: ignore[list-item]


@pytest.mark.parametrize("seed, message", [(2**64, "below 2\\*\\*64"), (10**30, "below 2\\*\\*64"),
                                           (1.5, "integer"), ("7", "integer"), (True, "integer")])
def test_a_seed_that_is_no_integer_or_beyond_64_bits_is_refused(seed: Any, message: str) -> None:
    refused(f"seed must be.*{message}", prompt="hi", seed=seed)


def test_seeds_up_to_64_bits_are_kept_and_the_choices_seeds_wrap_around_below_2_to_the_64() -> None:
    request = GenerationRequest.build(DEFAULTS, prompt="hi", seed=2**64 - 2, n=3)
    seeds = [m.params.seed for m in request.generate_messages("r", [None] * 3, 0.0)]  # type: ignore[list-item]
    assert seeds == [2**64 - 2, 2**64 - 1, 0]
    assert SamplingParams(seed=0xFFFFFFFF).seed == 0xFFFFFFFF  # llama-server's random seed is an ordinary one here


# -- lone surrogates, wherever a string goes --------------------------------------------------

@pytest.mark.parametrize("build, where", [
    ({"prompt": f"a{LONE}b"}, "prompt"),
    ({"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": f"x{LONE}"}]}, "messages\\[1\\].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": f"x{LONE}"}]}]},
     "messages\\[0\\].content\\[0\\].text"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": f'{{"city": "{LONE}"}}'}}]},
        {"role": "user", "content": "?"}], "tools": [WEATHER]}, "messages\\[1\\].tool_calls\\[0\\].function.arguments"),
    ({"messages": [{"role": "user", "content": "q", f"k{LONE}": 1}]}, "a key of messages\\[0\\]"),
    ({"prompt": "hi", "stop": ["ok", f"{LONE}"]}, "stop\\[1\\]"),
    ({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function", "function": {
        "name": "f", "description": f"d{LONE}"}}]}, "tools\\[0\\].function.description"),
    ({"prompt": "hi", "json_schema": {"type": "object", "properties": {"a": {"enum": [f"{LONE}"]}}}},
     "json_schema.properties.a.enum\\[0\\]"),
    ({"prompt": "hi", "grammar": f'root ::= "{LONE}"'}, "grammar"),
    ({"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": {"name": LONE}},
     "chat_template_kwargs.name"),
])
def test_a_lone_surrogate_anywhere_is_refused_naming_where(build: dict[str, Any], where: str) -> None:
    error = refused(f"^{where} holds a lone surrogate", **build)
    assert error.details["param"].replace("\\", "") == where.replace("\\", "")


def test_embedding_inputs_and_the_tokenizer_routes_refuse_lone_surrogates_too() -> None:
    with pytest.raises(InvalidRequestError, match=r"^input\[1\] holds a lone surrogate"):
        EmbeddingRequest.build(["fine", f"not{LONE}"])
    with pytest.raises(InvalidRequestError, match="^input holds"):
        EmbeddingRequest(("x\udfff",))
    for body, where in ((TokenizeRequest(content=f"a{LONE}"), "content"),
                        (TokenizeRequest(content=["a", 5, LONE]), r"content\[2\]"),
                        (TokenizeRequest(prompt=LONE), "prompt"),
                        (TokenizeRequest(messages=[{"role": "user", "content": LONE}]), r"messages\[0\].content")):
        with pytest.raises(InvalidRequestError, match=f"^{where} holds a lone surrogate"):
            tokenize_call(body)
    with pytest.raises(InvalidRequestError, match=r"^tools\[0\].function.name"):
        apply_template_call(ApplyTemplateRequest(messages=[{"role": "user", "content": "q"}],
                                                 tools=[{"type": "function", "function": {"name": f"f{LONE}"}}]))


def test_valid_text_passes_a_surrogate_pair_given_as_one_character_included() -> None:
    GenerationRequest.build(DEFAULTS, messages=[{"role": "user", "content": "caf\u00e9 \U0001F600 \u4e2d"}], stop=["\U0001F600"])
    check_text({"a": ["\U0001F600", {"b": "\u00e9"}]}, "x")


# -- earlier tool calls and the number of messages --------------------------------------------

BAD_CALLS = [([{"id": "c1", "type": "function"}], r"messages\[1\].tool_calls\[0\] must be"),
             (["not a call"], r"messages\[1\].tool_calls\[0\] must be"),
             ([{"function": {"arguments": "{}"}}], r"messages\[1\].tool_calls\[0\].function.name"),
             ([{"function": {"name": "get_weather", "arguments": 5}}], r"messages\[1\].tool_calls\[0\].function.arguments"),
             ([{"type": "web", "function": {"name": "get_weather"}}], r"messages\[1\].tool_calls\[0\].type"),
             ("get_weather()", r"messages\[1\].tool_calls must be a list")]


@pytest.mark.parametrize("calls, where", BAD_CALLS)
@pytest.mark.parametrize("tools", [[WEATHER], None])
def test_malformed_tool_calls_of_an_earlier_turn_are_refused_naming_the_message(calls: Any, where: str,
                                                                                 tools: Any) -> None:
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
    refused(f"^{where}", messages=messages, tools=tools)
    with pytest.raises((InvalidRequestError, ValidationError)):  # the route's schema refuses a non-object
        tokenize_call(TokenizeRequest(messages=messages))


def test_well_formed_tool_calls_pass_with_arguments_as_text_or_an_object() -> None:
    for arguments in ('{"city": "Paris"}', {"city": "Paris"}, None):
        GenerationRequest.build(DEFAULTS, tools=[WEATHER], messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {
                "name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"}])


def test_more_messages_than_the_cap_are_refused_at_once_before_anything_is_rendered() -> None:
    GenerationRequest.build(DEFAULTS, messages=[{"role": "user", "content": "x"}] * MAX_MESSAGES)
    start = time.perf_counter()
    refused(f"60001 messages: at most {MAX_MESSAGES}", messages=[{"role": "user", "content": "x"}] * 60001,
            tools=[WEATHER])
    assert time.perf_counter() - start < 2.0
    with pytest.raises(InvalidRequestError, match=f"at most {MAX_MESSAGES}"):
        apply_template_call(ApplyTemplateRequest(messages=[{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)))


# -- schemas and grammars ---------------------------------------------------------------------

def nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize("levels", [40, 300, 5000])
def test_a_deep_json_schema_is_a_400_with_a_reason_never_a_recursion_error(levels: int) -> None:
    refused("json_schema nests more than 64 levels", prompt="hi", json_schema=nested_schema(levels))
    with pytest.raises(InvalidRequestError, match=r"tools\[0\].function.parameters nests more than 64"):
        GenerationRequest.build(DEFAULTS, messages=[{"role": "user", "content": "q"}], tools=[
            {"type": "function", "function": {"name": "f", "parameters": nested_schema(levels)}}])
    Grammar.json_schema(nested_schema(20))  # deeper than real schemas go


def test_a_json_schema_with_too_many_properties_and_a_huge_grammar_are_refused_with_their_caps() -> None:
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1001)}}
    refused("1001 object properties in all: at most 1000", prompt="hi", json_schema=wide)
    alternatives = "root ::= " + " | ".join(f'"w{i}"' for i in range(25_000))
    refused("grammar is .* characters long: at most 32768", prompt="hi", grammar=alternatives)
    with pytest.raises(InvalidRequestError, match="grammar is"):
        Grammar.regex("a" * 40_000)


@pytest.mark.parametrize("make", [
    lambda: Grammar.gbnf('root ::= "a" undefined_rule'),
    lambda: Grammar.gbnf("root ::= ((("),
    lambda: Grammar.lark("start: /[/"),
    lambda: Grammar.regex("(unclosed"),
    lambda: Grammar.json_schema('{"type": '),
    lambda: Grammar.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
    lambda: Grammar.json_schema("[" * 10_000 + "]" * 10_000),
])
def test_every_compile_error_is_an_invalid_request_with_a_short_message(make: Any) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        make()
    assert len(str(caught.value)) < 1100 and "Traceback" not in str(caught.value)


# -- stop strings -----------------------------------------------------------------------------

def test_a_stop_string_longer_than_the_cap_is_refused_naming_it() -> None:
    SamplingParams(stop=("x" * 256,))
    refused(r"stop\[1\] is 257 characters long: at most 256", prompt="hi", stop=["ok", "x" * 257])


def reference_assembly(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], str, str | None]:
    """The stop-string rules by their definition (slow and obvious): after each piece, the
    earliest occurrence of any stop ends the text; else all but the longest tail that is a proper
    prefix of a stop is shown."""
    text, shown, out = "", 0, []
    for piece in pieces:
        text += piece
        hits = [(text.find(s), k) for k, s in enumerate(stops) if s in text]
        if hits:
            at, k = min(hits)
            out.append(text[shown:max(at, shown)])
            return out, text[:at], stops[k]
        hold = max((n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
        upto = max(shown, len(text) - hold)
        out.append(text[shown:upto])
        shown = upto
    out.append(text[shown:])
    return out, text, None


@settings(max_examples=300, deadline=None)
@given(stops=st.lists(st.text("abc", min_size=1, max_size=6), min_size=1, max_size=4),
       pieces=st.lists(st.text("abc", max_size=4), max_size=12))
def test_the_linear_stop_matcher_agrees_with_the_definition(stops: list[str], pieces: list[str]) -> None:
    assembler = TextAssembler(tuple(stops))
    shown = []
    for piece in pieces:
        shown.append(assembler.push(piece.encode()))
        if assembler.stopped:
            break
    shown.append(assembler.finish())
    expected, text, stop = reference_assembly(tuple(stops), pieces)
    assert "".join(shown) == "".join(expected) == text == assembler.text
    assert assembler.stop_sequence == stop and assembler.stopped == (stop is not None)


def per_token_seconds(stop_length: int, n_tokens: int = 400) -> float:
    """The best of three runs: ``n_tokens`` plain-text tokens against 16 stop strings that never match."""
    stops = tuple(("xyz" * stop_length)[:stop_length - 1] + chr(0x41 + k) for k in range(16))
    best = float("inf")
    for _ in range(3):
        assembler = TextAssembler(stops)
        start = time.perf_counter()
        for _ in range(n_tokens):
            assembler.push(b" the")
        best = min(best, (time.perf_counter() - start) / n_tokens)
    return best


def test_the_stop_hold_back_costs_the_same_per_token_whatever_the_stops_length() -> None:
    # Re-comparing every prefix of every stop at every token (the quadratic check) made 256
    # characters cost ~100 times 8 characters' time; matching linearly, the length is free.
    short, long = per_token_seconds(8), per_token_seconds(256)
    assert long < 4 * short + 20e-6, f"{long * 1e6:.1f} us/token with 256-character stops, {short * 1e6:.1f} with 8"
