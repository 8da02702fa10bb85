"""Structured output, tool calls, streamed logprobs and echo over HTTP, with the official openai client."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator

import numpy as np
import openai
import pydantic
import pytest

from llamactor.native.engine import Engine

from tests.conftest import NEAR_TIE, decode_prompt, top2_margin
from tests.support.daemon import MODEL_ID, Daemon, start_daemon
from tests.support.structured import PERSON_SCHEMA, Capital, valid_person

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
CLOCK_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                               "parameters": {"type": "object", "properties": {}}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "16")
    yield d
    assert d.stop() == 0


def _client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="none", max_retries=0)


def test_chat_completions_parse_returns_the_pydantic_object(daemon: Daemon) -> None:
    result = _client(daemon).chat.completions.parse(
        model=MODEL_ID, messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format=Capital, temperature=0, max_tokens=64)
    message = result.choices[0].message
    assert isinstance(message.parsed, Capital) and result.choices[0].finish_reason == "stop"


def test_json_mode_gives_a_json_object(daemon: Daemon) -> None:
    chat = _client(daemon).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Return JSON with the keys city and country for Paris."}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=256)
    assert chat.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(chat.choices[0].message.content), dict)


def test_sixteen_concurrent_schema_requests_over_http_all_validate(daemon: Daemon) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}}

    def one(i: int) -> str:
        chat = _client(daemon).chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": f"Describe person {i} as JSON."}],
            response_format=fmt, temperature=0.9, seed=i, max_tokens=96)
        return chat.choices[0].message.content or ""
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(one, range(16)))
    assert all(valid_person(t) for t in texts), [t for t in texts if not valid_person(t)]


def test_a_forced_tool_call_comes_back_as_tool_calls_streamed_and_not(daemon: Daemon) -> None:
    client = _client(daemon)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        chat = client.chat.completions.create(model=MODEL_ID, messages=ASK_WEATHER, tools=[WEATHER_TOOL, CLOCK_TOOL],
                                              tool_choice=choice, temperature=0, max_tokens=64)
        (call,) = chat.choices[0].message.tool_calls
        assert chat.choices[0].finish_reason == "tool_calls" and call.id.startswith("call_")
        if choice != "required":
            assert call.function.name == "get_weather"
        if call.function.name == "get_weather":
            assert isinstance(json.loads(call.function.arguments)["city"], str)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(model=MODEL_ID, messages=ASK_WEATHER, tools=[WEATHER_TOOL],
                                                tool_choice="required", temperature=0, max_tokens=64, stream=True):
        for c in chunk.choices:
            assert not c.delta.content  # the call's text never leaks out as content
            for t in c.delta.tool_calls or []:
                entry = calls.setdefault(t.index, {"name": "", "arguments": ""})
                entry["name"] += t.function.name or ""
                entry["arguments"] += t.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather"
    assert isinstance(json.loads(calls[0]["arguments"])["city"], str)


def test_a_tool_result_in_the_history_is_accepted_and_tool_choice_none_never_calls(daemon: Daemon) -> None:
    client = _client(daemon)
    first = client.chat.completions.create(model=MODEL_ID, messages=ASK_WEATHER, tools=[WEATHER_TOOL],
                                           tool_choice="required", temperature=0, max_tokens=64)
    call = first.choices[0].message.tool_calls[0]
    history = ASK_WEATHER + [first.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    answer = client.chat.completions.create(model=MODEL_ID, messages=history, tools=[WEATHER_TOOL],
                                            tool_choice="none", temperature=0, max_tokens=24)
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(model=MODEL_ID, messages=ASK_WEATHER, tools=[WEATHER_TOOL],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})


def test_streamed_logprobs_belong_to_the_pieces_they_arrive_with(daemon: Daemon) -> None:
    client = _client(daemon)
    text, tokens = "", []
    for chunk in client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Count to five"}],
                                                max_tokens=16, temperature=0, logprobs=True, top_logprobs=2, stream=True):
        for c in chunk.choices:
            text += c.delta.content or ""
            tokens += c.logprobs.content if c.logprobs and c.logprobs.content else []
    assert len(tokens) >= 1 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in tokens)
    assert "".join(t.token for t in tokens).startswith(text.rstrip()[:8])
    legacy_text, legacy_tokens = "", []
    for chunk in client.completions.create(model=MODEL_ID, prompt="One, two,", max_tokens=8, temperature=0,
                                           logprobs=1, stream=True):
        legacy_text += chunk.choices[0].text
        legacy_tokens += chunk.choices[0].logprobs.tokens if chunk.choices[0].logprobs else []
    assert legacy_text and "".join(legacy_tokens) == legacy_text
    # echo streams the prompt first; a grammar fixes what follows (a second greedy decode of the
    # prompt could differ from legacy_text after a near-tie), so the whole text is known
    echoed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model=MODEL_ID, prompt="One, two,", max_tokens=8, temperature=0, stream=True, echo=True,
        extra_body={"grammar": 'root ::= " three, four"'}))
    assert echoed == "One, two, three, four"


def test_a_gbnf_grammar_and_logit_bias_extras(daemon: Daemon) -> None:
    client = _client(daemon)
    c = client.completions.create(model=MODEL_ID, prompt="Is the sky blue? Answer:", max_tokens=4, temperature=1.0,
                                  extra_body={"grammar": 'root ::= " yes" | " no"'})
    assert c.choices[0].text in (" yes", " no")
    echoed = client.completions.create(model=MODEL_ID, prompt="Hello", max_tokens=2, temperature=0, echo=True)
    assert echoed.choices[0].text.startswith("Hello")
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(model=MODEL_ID, prompt="Hi", logit_bias={"99999999": 5})
    with pytest.raises(openai.BadRequestError, match="at most one of"):
        client.chat.completions.create(model=MODEL_ID, messages=ASK_WEATHER, response_format={"type": "json_object"},
                                       extra_body={"grammar": 'root ::= "x"'})


def test_logit_bias_over_http_bans_the_greedy_token_and_forces_another(daemon: Daemon,
                                                                        reference_engine: Engine) -> None:
    client, piece = _client(daemon), reference_engine.tokenizer.detokenize
    prompt = "The capital of France is"
    tokens = reference_engine.tokenizer.tokenize(prompt)
    reference_engine.clear()
    greedy_id = int(np.argmax(decode_prompt(reference_engine, 0, tokens)))
    plain = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=1, temperature=0)
    # decoded alone by the daemon too: the reference's greedy token, unless the two best nearly tie
    assert plain.choices[0].text == piece([greedy_id]) or top2_margin(reference_engine, tokens) < NEAR_TIE
    banned = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=1, temperature=0,
                                       logit_bias={str(greedy_id): -100})
    assert banned.choices[0].text != piece([greedy_id])
    forced_id = reference_engine.tokenizer.tokenize(" London", add_special=False)[0]
    forced = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=1, temperature=0,
                                       logit_bias={str(forced_id): 100})
    assert forced.choices[0].text == piece([forced_id]) != piece([greedy_id])


class Population(pydantic.BaseModel):
    city: str
    population_millions: float


def test_parse_with_a_float_field_ends_its_number_and_parses(daemon: Daemon) -> None:
    # Unbounded, the base model writes "1000000000000..." until max_tokens and the parse fails;
    # bounded as llama.cpp bounds numbers, the JSON closes.
    answer = daemon.client().chat.completions.parse(
        model=MODEL_ID, response_format=Population, temperature=0, max_tokens=120,
        messages=[{"role": "user", "content": "Population of Paris in millions, all digits: 1000000000000000000000"}])
    assert isinstance(answer.choices[0].message.parsed, Population)


def test_a_json_schema_without_strict_closes_its_objects(daemon: Daemon) -> None:
    # instructor's Mode.JSON_SCHEMA and LangChain send json_schema without strict
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    answer = daemon.client().chat.completions.create(
        model=MODEL_ID, temperature=0, max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
        messages=[{"role": "user", "content": "A person as JSON with many extra fields."}])
    person = json.loads(answer.choices[0].message.content)
    assert set(person) == {"name", "age"} and abs(person["age"]) <= 10**16


OPEN_WEATHER = {"type": "function", "function": {  # its object not closed: additionalProperties left out
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                                          "required": ["city"]}}}


def get_weather(city: str) -> str:
    return f"sunny in {city}"


def test_sampled_forced_tool_calls_have_closed_arguments_the_function_can_take(daemon: Daemon) -> None:
    chat = _client(daemon).chat.completions.create(model=MODEL_ID, messages=ASK_WEATHER, tools=[OPEN_WEATHER],
                                                   tool_choice="required", n=6, seed=1, max_tokens=64)
    calls = [(choice.message.tool_calls or [])[0] for choice in chat.choices]
    assert len(calls) == 6
    for call in calls:  # an extra key ({"city": ..., "type": "object"}) would be a TypeError here
        assert get_weather(**json.loads(call.function.arguments)).startswith("sunny in")
