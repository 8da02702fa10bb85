"""The Anthropic Messages API of the daemon (a real subprocess on the default model), driven by the
official ``anthropic`` client: messages, its stream helper, tools, structured output, token
counts, stop sequences, and errors in Anthropic's shape.

The default model is a tiny base model: its answers are poor, so tests check the protocol and
what is exact (token counts, constrained output), not what the model says. The message, stream
and tool round trips run on SmolLM2-135M-Instruct too (a daemon of its own): its GGUF's template."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import pydantic
import pytest

from tests.support.daemon import API_KEY, MODEL_ID, Daemon, metric, start_daemon

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"name": "get_weather", "description": "The current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                            "required": ["city"]}}  # bounded: a forced call always closes within max_tokens
GREEDY = {"temperature": 0}  # not an SDK argument since anthropic 2.x: sent as the raw API field
GENERATED = r'llamactor_generated_tokens_total\{dialect="anthropic",model="' + MODEL_ID + r'"\}'


class Capital(pydantic.BaseModel):
    # bounded, so that the constrained JSON always closes within max_tokens, sampled or not
    country: str = pydantic.Field(max_length=24)
    capital: str = pydantic.Field(max_length=24)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "4", "--api-key", API_KEY)
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> anthropic.Anthropic:
    # base_url without /v1: the SDK posts to /v1/messages itself
    return anthropic.Anthropic(base_url=daemon.url, api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def instruct_client(instruct_path: str) -> Iterator[anthropic.Anthropic]:
    """A daemon on SmolLM2-135M-Instruct: the chat routes through the GGUF's own template."""
    d = start_daemon("--model", instruct_path, "--n-parallel", "2", "--api-key", API_KEY)
    yield anthropic.Anthropic(base_url=d.url, api_key=API_KEY, max_retries=0)
    assert d.stop() == 0


@pytest.fixture(params=["base", "instruct"])
def either_client(request: pytest.FixtureRequest) -> anthropic.Anthropic:
    """The base model's daemon (the transcript), then the instruct model's (its template)."""
    return request.getfixturevalue("client" if request.param == "base" else "instruct_client")


def prompt_tokens(usage: anthropic.types.Usage) -> int:
    """Anthropic counts the prompt's cached tokens apart from the rest."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def test_a_message_has_a_text_block_usage_and_a_stop_reason(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=MODEL_ID, max_tokens=16, messages=QUESTION, extra_body=GREEDY)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == MODEL_ID
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert 0 < m.usage.output_tokens <= 16 and prompt_tokens(m.usage) > 5 and m.usage.cache_creation_input_tokens == 0
    if m.stop_reason == "max_tokens":
        assert m.usage.output_tokens == 16
    # a single-model daemon answers to any model name, naming its own
    assert client.messages.create(model="some-other-name", max_tokens=2, messages=QUESTION).model == MODEL_ID


def test_the_sdk_stream_helper_gets_the_text_deltas_and_the_final_message(either_client: anthropic.Anthropic) -> None:
    client = either_client
    with client.messages.stream(model=MODEL_ID, max_tokens=24, messages=QUESTION, system="Answer in one sentence.",
                                extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and [b.type for b in final.content] == ["text"] and final.content[0].text == text
    assert final.id.startswith("msg_") and final.stop_reason in ("end_turn", "max_tokens")
    assert 0 < final.usage.output_tokens <= 24
    # message_start cannot know the prompt's tokens yet; message_delta brings them
    assert prompt_tokens(final.usage) == client.messages.count_tokens(
        model=MODEL_ID, messages=QUESTION, system="Answer in one sentence.").input_tokens
    events = [e.type for e in client.messages.create(model=MODEL_ID, max_tokens=4, messages=QUESTION, stream=True)]
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    assert events[1] == "content_block_start" and "content_block_stop" in events  # (pings are skipped by the SDK)


def test_a_forced_tool_call_and_its_result_make_a_round_trip(either_client: anthropic.Anthropic) -> None:
    client = either_client
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = client.messages.create(model=MODEL_ID, max_tokens=64, messages=ask, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "get_weather"})
    assert m.stop_reason == "tool_use" and m.content[-1].type == "tool_use"
    call = m.content[-1]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    assert isinstance(call.input, dict) and isinstance(call.input.get("city"), str)
    history = [*ask, {"role": "assistant", "content": m.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": "Sunny, 24 degrees."}]}]
    answer = client.messages.create(model=MODEL_ID, max_tokens=16, messages=history, tools=[WEATHER],
                                    tool_choice={"type": "none"}, extra_body=GREEDY)
    assert [b.type for b in answer.content] == ["text"] and answer.stop_reason in ("end_turn", "max_tokens")
    # the call and its result are in the prompt: counted exactly as the model saw them
    assert prompt_tokens(answer.usage) == client.messages.count_tokens(
        model=MODEL_ID, messages=history, tools=[WEATHER], tool_choice={"type": "none"}).input_tokens
    assert prompt_tokens(answer.usage) > prompt_tokens(m.usage)
    with client.messages.stream(model=MODEL_ID, max_tokens=64, messages=ask, tools=[WEATHER],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
    assert isinstance(final.content[0].input, dict) and "city" in final.content[0].input


def test_structured_output_is_valid_json_of_the_schema(client: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 24},
                                               "population": {"type": "integer"}},
              "required": ["capital", "population"]}
    m = client.messages.create(model=MODEL_ID, max_tokens=128, messages=QUESTION,
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    data = json.loads(m.content[0].text)
    assert set(data) == {"capital", "population"} and isinstance(data["population"], int)
    # The SDK moves maxLength out of a pydantic model's schema (into its description), so these
    # strings are unbounded: greedy, so that the answer always closes (a sampled one ran on once).
    parsed = client.messages.parse(model=MODEL_ID, max_tokens=128, messages=QUESTION, output_format=Capital,
                                   extra_body=GREEDY)
    assert isinstance(parsed.parsed_output, Capital)
    with client.messages.stream(model=MODEL_ID, max_tokens=128, messages=QUESTION, output_format=Capital,
                                extra_body=GREEDY) as stream:
        assert isinstance(stream.get_final_message().parsed_output, Capital)


def test_count_tokens_equals_the_prompt_tokens_of_the_same_conversation(client: anthropic.Anthropic) -> None:
    conversation = {"system": [{"type": "text", "text": "You are terse."}], "tools": [WEATHER],
                    "thinking": {"type": "disabled"}, "messages": [
        {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi. How can I help?"},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "text", "text": "In Rome."}]}]}
    counted = client.messages.count_tokens(model=MODEL_ID, **conversation).input_tokens
    m = client.messages.create(model=MODEL_ID, max_tokens=4, **conversation)
    assert counted == prompt_tokens(m.usage) and counted > 50  # (the tools are described in the prompt)


def test_stop_sequences_end_the_answer_and_say_which_one_matched(client: anthropic.Anthropic) -> None:
    # A space comes early in any answer; the other stop string never does.
    m = client.messages.create(model=MODEL_ID, max_tokens=32, messages=QUESTION, stop_sequences=["zzqqxx", " "],
                               extra_body=GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == " " and " " not in m.content[0].text
    with client.messages.stream(model=MODEL_ID, max_tokens=32, messages=QUESTION, stop_sequences=[" "],
                                extra_body=GREEDY) as stream:  # greedy: the answer above, which has a space
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == " "
    m = client.messages.create(model=MODEL_ID, max_tokens=32, messages=QUESTION, stop_sequences=["zzqqxx"])
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None


def test_a_max_tokens_larger_than_the_context_is_an_upper_bound(client: anthropic.Anthropic, daemon: Daemon) -> None:
    # greedy: the answer of the test above, which has a space (a sampled one may end before any)
    m = client.messages.create(model=MODEL_ID, max_tokens=8192, messages=QUESTION, stop_sequences=[" "],
                               extra_body=GREEDY)  # n_ctx 4096
    assert m.stop_reason == "stop_sequence"
    assert daemon.wait_for_log(lambda line: line.get("event") == "max_tokens_clamped"
                               and line.get("max_tokens") == 8192)


def test_errors_have_anthropics_shape_and_sdk_classes(client: anthropic.Anthropic, daemon: Daemon) -> None:
    raw = httpx.post(f"{daemon.url}/v1/messages", headers={"x-api-key": API_KEY},
                     json={"model": MODEL_ID, "messages": QUESTION}, timeout=30)
    assert raw.status_code == 400 and raw.json() == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"}}
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL_ID, max_tokens=8, messages=QUESTION, extra_body={"temprature": 0})
    assert bad.value.body["error"]["type"] == "invalid_request_error" and "temprature" in str(bad.value)
    with pytest.raises(anthropic.BadRequestError, match="server tools"):
        client.messages.create(model=MODEL_ID, max_tokens=8, messages=QUESTION,
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):  # refused before the stream's 200
        with client.messages.stream(model=MODEL_ID, max_tokens=8,
                                    messages=[{"role": "user", "content": "word " * 5000}]) as stream:
            stream.get_final_message()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=daemon.url, api_key="wrong", max_retries=0).messages.count_tokens(
            model=MODEL_ID, messages=QUESTION)
    ok = httpx.post(f"{daemon.url}/v1/messages/count_tokens", headers={"x-api-key": API_KEY},
                    json={"model": MODEL_ID, "messages": QUESTION}, timeout=30)
    assert ok.status_code == 200 and ok.json()["input_tokens"] > 5  # x-api-key, as curl and older SDKs send it


def test_a_bad_request_loses_nothing_of_a_stream_in_flight(client: anthropic.Anthropic) -> None:
    events = client.messages.create(model=MODEL_ID, max_tokens=24, messages=QUESTION, stream=True)
    seen = [next(iter(events)).type]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL_ID, max_tokens=8, messages=[{"role": "robot", "content": "x"}])
    seen += [e.type for e in events]
    assert seen[0] == "message_start" and seen[-2:] == ["message_delta", "message_stop"]


def test_fields_accepted_but_not_honoured_are_named_in_a_warning_and_requests_are_counted(
        client: anthropic.Anthropic, daemon: Daemon) -> None:
    client.messages.create(model=MODEL_ID, max_tokens=2, messages=QUESTION, metadata={"user_id": "u-1"},
                           service_tier="auto", speed="fast")
    assert daemon.wait_for_log(lambda line: line.get("event") == "request_fields_ignored"
                               and line.get("dialect") == "anthropic"
                               and line.get("fields") == ["service_tier", "speed"])  # (metadata changes nothing)
    assert metric(httpx.get(f"{daemon.url}/metrics", timeout=30).text, GENERATED) > 0


def test_sampled_tool_uses_have_closed_inputs_even_when_the_schema_leaves_them_open(
        client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    for _ in range(4):  # sampled (temperature 1): an extra key would come back now and then without the fix
        m = client.messages.create(model=MODEL_ID, max_tokens=64, messages=ask, tools=[WEATHER], extra_body={"temperature": 1.0},
                                   tool_choice={"type": "tool", "name": "get_weather"})
        assert m.content[-1].type == "tool_use" and set(m.content[-1].input) == {"city"}, m.content[-1].input
