"""``/v1/responses`` of a real daemon through the official openai client: plain and streamed
answers, conversations continued with ``previous_response_id`` (a prefix-cache hit), tool calls
and their results, structured output, and errors in OpenAI's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.daemon import API_KEY, MODEL_ID, Daemon, metric, start_daemon

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"],
                          "additionalProperties": False}}
CALL_WEATHER = {"type": "function", "name": "get_weather"}
INSTRUCT = "smollm2"
BOTH = pytest.mark.parametrize("model", [MODEL_ID, INSTRUCT])  # the transcript, and the instruct model's template
STORY = ("Once upon a time, in a small village by the sea, there lived an old fisherman who went out "
         "every morning before sunrise. What did he see one day?")


class Weather(BaseModel):
    city: str = Field(max_length=24)  # bounded: the constrained JSON always closes within max_output_tokens
    sunny: bool


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: str, instruct_path: str) -> Iterator[Daemon]:
    # a second model, so that an unknown model name is a 404, not the default model: the instruct
    # one (its own template), loaded by its first request
    config = tmp_path_factory.mktemp("config") / "models.toml"
    config.write_text(f'[[models]]\nname = "{MODEL_ID}"\npath = "{model_path}"\nn_parallel = 4\n\n'
                      f'[[models]]\nname = "{INSTRUCT}"\npath = "{instruct_path}"\npreload = false\n')
    d = start_daemon("--config", str(config), "--api-key", API_KEY)
    yield d
    assert d.stop() == 0


@pytest.fixture
def client(daemon: Daemon) -> openai.OpenAI:
    return daemon.client()


@BOTH
def test_a_plain_answer_is_a_completed_response_with_usage(client: openai.OpenAI, model: str) -> None:
    r = client.responses.create(model=model, input="Name a colour of the sea.", instructions="Answer briefly.",
                                max_output_tokens=12, temperature=0, metadata={"run": "1"})
    assert r.id.startswith("resp_") and r.object == "response" and r.model == model
    assert r.output_text.strip() and r.output[0].type == "message" and r.output[0].id.startswith("msg_")
    assert r.status in ("completed", "incomplete") and r.instructions == "Answer briefly."
    assert r.metadata == {"run": "1"}
    assert r.usage is not None and r.usage.input_tokens > 5 and 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert client.responses.retrieve(r.id).output_text == r.output_text  # stored


@BOTH
def test_a_streamed_answer_through_the_sdk_helper_adds_up_to_its_final_response(client: openai.OpenAI, model: str) -> None:
    # (the helper's final response needs response.completed: an answer that ends before max_output_tokens)
    with client.responses.stream(model=model, input="Say hi", max_output_tokens=24, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas and "".join(deltas) == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert final.status == "completed" and final.usage is not None and final.usage.output_tokens > 0


def test_an_unknown_field_is_accepted_and_named_in_a_warning(daemon: Daemon, client: openai.OpenAI) -> None:
    client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=2, reasoning={"effort": "low"},
                            extra_body={"frobnicate": 1})
    assert daemon.wait_for_log(lambda line: line.get("event") == "request_fields_ignored"
                               and line.get("fields") == ["reasoning", "frobnicate"])


def test_a_cut_short_answer_is_incomplete_streamed_and_not(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL_ID, input=STORY, max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.output_text
    last = list(client.responses.create(model=MODEL_ID, input=STORY, max_output_tokens=3, temperature=0,
                                        stream=True))[-1]
    assert last.type == "response.incomplete" and last.response.output[0].status == "incomplete"


def test_a_follow_up_turn_continues_the_stored_conversation_from_the_prefix_cache(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL_ID, input=STORY, max_output_tokens=16, temperature=0)
    second = client.responses.create(model=MODEL_ID, input="And then?", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    assert first.usage is not None and second.usage is not None and second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens  # the whole conversation went in again
    assert 0 < second.usage.input_tokens_details.cached_tokens <= second.usage.input_tokens
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL_ID, input="Hi", previous_response_id="resp_never_made")
    assert caught.value.code == "previous_response_not_found" and caught.value.param == "previous_response_id"


def test_a_response_not_stored_cannot_be_continued_and_a_deleted_one_is_gone(client: openai.OpenAI) -> None:
    unstored = client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL_ID, input="Hi", previous_response_id=unstored.id)
    kept = client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=2)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


@BOTH
def test_a_forced_tool_call_and_its_result_make_a_round_trip(client: openai.OpenAI, model: str) -> None:
    called = client.responses.create(model=model, input="What is the weather in Paris?", tools=[WEATHER],
                                     tool_choice=CALL_WEATHER, temperature=0)
    [call] = [o for o in called.output if o.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and called.status == "completed"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}
    answer = client.responses.create(model=model, previous_response_id=called.id, input=[result],
                                     tools=[WEATHER], tool_choice="none", max_output_tokens=12, temperature=0)
    assert answer.output[0].type == "message" and answer.usage is not None and called.usage is not None
    assert answer.usage.input_tokens > called.usage.input_tokens + called.usage.output_tokens
    # stateless: the client replays the output items (with their ids and statuses) itself
    replayed = client.responses.create(
        model=model, store=False, tools=[WEATHER], tool_choice="none", max_output_tokens=4,
        input=[{"role": "user", "content": "What is the weather in Paris?"}, *called.output, result])
    assert replayed.usage is not None and replayed.usage.input_tokens == answer.usage.input_tokens


@BOTH
def test_a_streamed_forced_tool_call_arrives_as_a_function_call_item(client: openai.OpenAI, model: str) -> None:
    with client.responses.stream(model=model, input="Weather in Rome?", tools=[WEATHER],
                                 tool_choice=CALL_WEATHER, temperature=0) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_response()
    [item] = final.output
    assert item.type == "function_call" and set(item.parsed_arguments) == {"city"}
    assert "response.function_call_arguments.done" in types and "response.output_text.delta" not in types


def test_structured_output_is_parsed_into_the_pydantic_model(client: openai.OpenAI) -> None:
    r = client.responses.parse(model=MODEL_ID, input="The weather in Paris, as JSON.", text_format=Weather,
                               temperature=0, max_output_tokens=80)
    assert isinstance(r.output_parsed, Weather) and r.output_parsed.city
    json_mode = client.responses.create(model=MODEL_ID, input="A JSON object about Paris:", temperature=0,
                                        max_output_tokens=40, text={"format": {"type": "json_object"}})
    assert json_mode.status == "incomplete" or isinstance(json.loads(json_mode.output_text), dict)


def test_bad_requests_are_400s_in_openai_shape_and_an_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL_ID, input="Hi", tools=[WEATHER, {"type": "web_search"}])
    assert caught.value.param == "tools[1].type" and caught.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=0)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL_ID, input=[{"role": "user", "content": [{"type": "input_file"}]}])
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="poet", input="Hi")
    assert missing.value.code == "model_not_found"


def test_a_prompt_over_the_context_is_a_400_before_the_stream_and_loses_nothing_else(
        daemon: Daemon, client: openai.OpenAI) -> None:
    running = client.responses.create(model=MODEL_ID, input=STORY, max_output_tokens=16, stream=True)  # 200 sent
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL_ID, input="sea " * 6000, stream=True)
    assert caught.value.code == "exceed_context_size_error"
    events = list(running)  # the request in flight went on
    assert events[-1].type in ("response.completed", "response.incomplete") and events[-1].response.output_text
    text = httpx.get(f"{daemon.url}/metrics").text
    assert metric(text, r'llamactor_generated_tokens_total\{dialect="responses",model="' + MODEL_ID + r'"\}') > 0


def test_the_raw_stream_names_each_event_and_sends_no_done_marker(daemon: Daemon) -> None:
    body = {"model": MODEL_ID, "input": "Hi", "max_output_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{daemon.url}/v1/responses", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        frames = [f for f in r.read().decode().split("\n\n") if f]
    assert r.headers["content-type"].startswith("text/event-stream")
    for frame in frames:
        event, data = frame.split("\n")
        assert event == f"event: {json.loads(data.removeprefix('data: '))['type']}"
    assert "[DONE]" not in frames[-1]


def test_sampled_function_calls_have_closed_arguments_even_when_the_schema_leaves_them_open(
        client: openai.OpenAI) -> None:
    open_weather = {**WEATHER, "strict": False, "parameters": {k: v for k, v in WEATHER["parameters"].items()  # type: ignore[union-attr]
                                                                 if k != "additionalProperties"}}
    for seed in range(1, 5):
        called = client.responses.create(model=MODEL_ID, input="What is the weather in Paris?", tools=[open_weather],
                                         tool_choice=CALL_WEATHER, extra_body={"seed": seed}, max_output_tokens=64)
        [call] = [o for o in called.output if o.type == "function_call"]
        assert set(json.loads(call.arguments)) == {"city"}, call.arguments
