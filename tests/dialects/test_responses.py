"""The Responses API's translation onto the chat path and its event stream, model-free: input items
to chat messages, tools and formats to sampling options, the response object and a streamed
answer checked by the openai SDK's own models and stream accumulator."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from llamactor.base.completion import Completion, Timings, Usage
from llamactor.base.errors import BatcherRestartedError, InvalidRequestError
from llamactor.base.tools import ToolCall
from llamactor.dialects.responses.call import ResponsesCall, input_messages, response_call
from llamactor.dialects.responses.events import ResponseEvents
from llamactor.dialects.responses.output_items import Shell, output_items, status_of, usage
from llamactor.dialects.responses.schema import ResponsesRequest
from llamactor.http.framing import NAMED_SSE
from llamactor.http.responses_store import ResponseStore

from tests.support.dialects import CTX, answered, framed, sse_data, updates

pytestmark = pytest.mark.pure

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def completion(text: str, finish: str = "stop", calls: tuple[ToolCall, ...] = ()) -> Completion:
    return Completion("resp_x", text, (1, 2, 3), finish, Usage(12, 3, 8), Timings(1, 2, 3, 4),  # type: ignore[arg-type]
                      tool_calls=calls)


def response_of(body: ResponsesRequest, earlier: list[dict[str, Any]] | None = None) -> ResponsesCall:
    return response_call(body, CTX, earlier or [])


def refused(call: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        call()
    return caught.value


def test_replayed_output_items_become_one_assistant_turn_and_their_extra_fields_are_ignored() -> None:
    items = [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look it up."}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "phase": None,
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}', "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "sunny"}]},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
    ]
    assert input_messages(items) == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "Look it up.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "system", "content": "Be brief."},
    ]


def test_unsupported_input_parts_and_item_types_are_refused_naming_the_field() -> None:
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]
    assert refused(lambda: input_messages(image)).details["param"] == "input[0].content[0].type"
    assert refused(lambda: input_messages([{"type": "item_reference", "id": "msg_1"}])).details["param"] == \
        "input[0].type"
    assert refused(lambda: input_messages([{"role": "tool", "content": "x"}])).details["param"] == "input[0].role"


def test_instructions_lead_the_chat_but_stay_out_of_the_history_that_is_stored() -> None:
    earlier = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."}]
    p = response_of(ResponsesRequest(input="Bye", instructions="Be kind.", max_output_tokens=5, temperature=0), earlier)
    messages = list(p.request.messages or ())
    assert messages == [{"role": "system", "content": "Be kind."}, *earlier, {"role": "user", "content": "Bye"}]
    assert p.history == messages[1:]
    assert p.request.params.temperature == 0 and p.request.params.max_tokens == 5 and p.request.tools is None
    assert refused(lambda: response_of(ResponsesRequest())).details["param"] == "input"


def test_flat_function_tools_and_a_named_choice_become_chat_tools_and_other_tool_types_are_refused() -> None:
    p = response_of(ResponsesRequest(input="Weather in Paris?", tools=[WEATHER],
                              tool_choice={"type": "function", "name": "get_weather"}))
    tools = p.request.tools
    assert tools is not None and p.request.parsed_tools is tools and p.request.params.grammar is not None
    assert tools.choice == "get_weather" and tools.functions[0]["parameters"] == WEATHER["parameters"]
    web = ResponsesRequest(input="x", tools=[WEATHER, {"type": "web_search"}])
    assert refused(lambda: response_of(web)).details["param"] == "tools[1].type"
    search = ResponsesRequest(input="x", tools=[WEATHER], tool_choice={"type": "file_search"})
    assert refused(lambda: response_of(search)).details["param"] == "tool_choice"
    assert refused(lambda: response_of(ResponsesRequest(input="x", tool_choice="required"))).details["param"] == "tool_choice"


def test_text_formats_become_the_constraint_of_the_answer() -> None:
    def grammar(fmt: dict[str, Any]) -> Any:
        return response_of(ResponsesRequest(input="x", text={"format": fmt})).request.params.grammar
    assert grammar({"type": "text"}) is None
    assert grammar({"type": "json_object"}).kind == "json_object"
    assert grammar({"type": "json_schema", "name": "W", "schema": WEATHER["parameters"]}).kind == "json_schema"
    assert refused(lambda: grammar({"type": "json_schema", "name": "W"})).details["param"] == "text.format.schema"


def test_fields_not_acted_on_and_unknown_fields_are_named_and_unsupported_modes_refused() -> None:
    body = ResponsesRequest.model_validate({"input": "x", "reasoning": {"effort": "low"}, "truncation": "auto",
                                            "metadata": {"k": "v"}, "store": False, "frobnicate": 1})
    assert body.ignored_fields() == ["reasoning", "truncation", "frobnicate"]
    assert ResponsesRequest(input="x", user="u", truncation="disabled").ignored_fields() == []
    assert refused(lambda: response_of(ResponsesRequest(input="x", background=True))).details["param"] == "background"


def test_a_finished_answer_is_a_response_object_the_sdk_reads() -> None:
    body = ResponsesRequest(input="x", metadata={"k": "v"}, tools=[WEATHER])
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    c = answered(completion("<think>Paris is in France.</think>Here:", "tool_calls", (call,)))
    r = Response.model_validate(Shell(body, "resp_1", "m", 0).response(status_of(c), output_items(c), usage(c)))
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    assert r.output_text == "Here:" and r.output[2].call_id == "call_1" and r.output[2].id.startswith("fc_")
    assert r.status == "completed" and r.metadata == {"k": "v"} and r.store is True
    assert r.usage is not None and r.usage.input_tokens_details.cached_tokens == 8 and r.usage.total_tokens == 15
    cut = completion("It was a dark", "length")
    r = Response.model_validate(Shell(body, "resp_2", "m", 0).response(status_of(cut), output_items(cut), usage(cut)))
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.output[0].status == "incomplete"


def streamed(pieces: list[str], done: Completion | None, tools: Any = None) -> tuple[list[str], Any, list[Any]]:
    """The event types as the transport frames them, the SDK accumulator's final response, and what
    was handed to the store."""
    body = ResponsesRequest(input="x", tools=[WEATHER] if tools else None)
    kept: list[Any] = []
    planned = response_of(body)
    stream = ResponseEvents(planned, kept.append)
    # as the engine's failure reaches a stream: after its pieces
    ended = done or BatcherRestartedError("the batcher crashed")
    body_text = framed(stream.events(updates(pieces, ended, planned.request)),
                       NAMED_SSE, stream.failed)
    events = sse_data(body_text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all(f.startswith(f"event: {e['type']}\n") for f, e in zip(body_text.split("\n\n"), events))
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[WEATHER] if tools else [], text_format=omit)
    final = None
    for event in events:
        wire = json.loads(json.dumps(event))
        for out in state.handle_event(construct_type(type_=ResponseStreamEvent, value=wire)):  # type: ignore[arg-type]
            final = getattr(out, "response", final) if out.type == "response.completed" else final
    return [e["type"] for e in events], final, kept


def test_a_streamed_answer_that_thinks_then_writes_satisfies_the_sdk_accumulator() -> None:
    types, final, kept = streamed(["<think>", "Paris is", " in France.</think>", "The capital", " is Paris."],
                                  completion("<think>Paris is in France.</think>The capital is Paris."))
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == 2
    assert "response.reasoning_text.delta" in types and types.count("response.output_text.delta") == 2
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output_text == "The capital is Paris." and final.output[0].content[0].text == "Paris is in France."
    assert [o["id"] for o in kept[0]["output"]] == [o.id for o in final.output]  # what is stored was sent


def test_a_streamed_tool_call_is_a_function_call_item_the_sdk_parses() -> None:
    call = ToolCall("call_9", "get_weather", '{"city": "Paris"}')
    types, final, _ = streamed(["<tool_", "call>\n", CALL_TEXT.removeprefix("<tool_call>\n")],
                               completion("", "tool_calls", (call,)), tools=True)
    assert "response.function_call_arguments.done" in types and "response.output_text.delta" not in types
    [item] = final.output
    assert item.type == "function_call" and item.parsed_arguments == {"city": "Paris"}
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")


def test_an_empty_or_cut_short_stream_still_closes_a_message_and_ends_incomplete() -> None:
    types, final, kept = streamed([], completion("", "length"))
    assert types[-1] == "response.incomplete" and final is None  # the SDK's helper only takes "completed"
    assert kept[0]["status"] == "incomplete" and kept[0]["output"][0]["content"][0]["text"] == ""


def test_an_engine_failure_after_the_first_event_ends_the_stream_with_response_failed() -> None:
    types, final, kept = streamed(["It was"], None)
    assert types[-1] == "response.failed" and final is None and kept == []  # nothing stored


def test_the_store_forgets_the_least_recently_used_response_first() -> None:
    store = ResponseStore(capacity=2)
    for rid in ("resp_a", "resp_b"):
        store.put("t", {"id": rid}, [{"role": "user", "content": rid}])
    assert store.get("t", "resp_a") is not None  # used: now the most recent
    store.put("t", {"id": "resp_c"}, [])
    assert store.get("t", "resp_b") is None and store.get("t", "resp_a") is not None and len(store) == 2
    assert store.get("u", "resp_a") is None and not store.delete("u", "resp_a")  # another tenant's: not found
    assert store.delete("t", "resp_a") and not store.delete("t", "resp_a")
