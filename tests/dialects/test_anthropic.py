"""The Anthropic dialect's pure parts: request translation, the Message object, and the event
stream read back by the official ``anthropic`` SDK's own stream helper (over a mock transport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import anthropic
import pydantic
import pytest

try:
    import httpx2 as http  # what anthropic 2.x is built on (it refuses httpx objects)
except ImportError:  # older SDKs
    import httpx as http

from llamactor.base.errors import InvalidRequestError, LlamactorError
from llamactor.base.tools import ToolCall
from llamactor.dialects.anthropic.call import MessagesCall, anthropic_tools, messages_call
from llamactor.dialects.anthropic.events import message_events, stream_error
from llamactor.dialects.anthropic.message import message
from llamactor.dialects.anthropic.schema import MessagesRequest, ToolChoice
from llamactor.http.anthropic_routes import ANTHROPIC_SSE
from llamactor.http.framing import with_keepalive

from tests.support.dialects import CTX, answered, completion, framed, updates

pytestmark = pytest.mark.pure
WEATHER = {"name": "get_weather", "description": "The weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def messages_of(**fields: Any) -> MessagesCall:
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return messages_call(MessagesRequest.model_validate({"model": "m", "max_tokens": 16, **fields}), CTX)


def chat(**fields: Any) -> list[dict[str, Any]]:
    return list(messages_of(**fields).request.messages or ())


def test_system_text_and_system_role_entries_become_one_leading_system_message() -> None:
    messages = chat(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind.",
                                                                    "cache_control": {"type": "ephemeral"}}],
                    messages=[{"role": "user", "content": "hi"}, {"role": "system", "content": "No jokes."}])
    assert messages == [{"role": "system", "content": "Be brief.\nBe kind.\nNo jokes."},
                                    {"role": "user", "content": "hi"}]


def test_tool_results_come_before_the_text_of_their_user_turn_and_calls_become_tool_calls() -> None:
    chat_ = chat(messages=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Two calls.", "signature": "x"},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}},
                                          {"type": "redacted_thinking", "data": "opaque"}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks!"},
                                     {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                      "content": [{"type": "text", "text": "no such"},
                                                  {"type": "text", "text": "city"}]}]}])
    assert chat_[1] == {"role": "assistant", "content": "Checking.", "reasoning_content": "Two calls.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert chat_[2:] == [{"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such\ncity"},
                        {"role": "user", "content": "Thanks!"}]


def test_blocks_and_tools_the_model_cannot_use_are_refused_with_where_they_are() -> None:
    with pytest.raises(InvalidRequestError, match=r"messages.0.content.1: image blocks are not supported"):
        chat(messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    with pytest.raises(InvalidRequestError, match="tools.0: server tools"):
        messages_of(tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(InvalidRequestError, match=r"messages.0.content.0.input: a JSON object"):
        chat(messages=[{"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}])
    with pytest.raises(InvalidRequestError, match='tool_choice "any" needs tools'):
        messages_of(tool_choice={"type": "any"})


def test_tool_choice_maps_to_llamactors_choices_and_parallel_use() -> None:
    assert anthropic_tools([WEATHER], None).choice == "auto"
    assert anthropic_tools([WEATHER], ToolChoice(type="any")).choice == "required"
    assert anthropic_tools([WEATHER], ToolChoice(type="none")).parses is False
    named = anthropic_tools([WEATHER], ToolChoice(type="tool", name="get_weather", disable_parallel_tool_use=True))
    assert named is not None and named.choice == "get_weather" and named.parallel is False
    assert named.grammar() is not None  # a named choice is constrained
    assert anthropic_tools([WEATHER], ToolChoice(type="auto", disable_parallel_tool_use=False)).parallel
    with pytest.raises(InvalidRequestError, match="not in tools"):
        anthropic_tools([WEATHER], ToolChoice(type="tool", name="nope"))


def test_sampling_fields_map_and_accepted_but_unhonoured_fields_are_named() -> None:
    p = messages_of(temperature=0.5, top_k=3, stop_sequences=["\n\n"], metadata={"user_id": "u"},
             thinking={"type": "enabled", "budget_tokens": 2048},
             output_config={"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}})
    params = p.request.params
    assert (params.max_tokens, params.temperature, params.top_k, params.stop) == (16, 0.5, 3, ("\n\n",))
    assert p.request.chat_template_kwargs == {"enable_thinking": True} and p.request.clamp_max_tokens
    assert params.grammar is not None and params.grammar.kind == "json_schema"
    assert p.ignored == ["output_config.effort", "thinking.budget_tokens"]  # (metadata changes nothing)
    with pytest.raises(pydantic.ValidationError, match="max_tokens"):
        MessagesRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(pydantic.ValidationError, match="temprature"):
        MessagesRequest.model_validate({"model": "m", "max_tokens": 1, "messages": [], "temprature": 0})


def test_the_stop_sequence_reported_is_the_callers_own_and_a_clamp_that_ran_out_is_the_window() -> None:
    p = messages_of(stop_sequences=["42", " is"])
    assert message(p, completion("The answer", stop_sequence=" is"))["stop_sequence"] == " is"
    ended = message(p, completion("Paris", stop_sequence="\nUser:"))  # the chat format's own stop: end of turn
    assert (ended["stop_sequence"], ended["stop_reason"]) == (None, "end_turn")
    assert message(p, completion("The answer", stop_sequence=" is"))["stop_reason"] == "stop_sequence"
    assert message(p, completion("a", "length", clamped_max_tokens=3))["stop_reason"] == "model_context_window_exceeded"
    assert message(p, completion("a", "length"))["stop_reason"] == "max_tokens"


def test_the_message_splits_reasoning_and_gives_tool_calls_object_inputs() -> None:
    call = ToolCall("call_abc", "get_weather", '{"city": "Paris"}')
    m = message(messages_of(), answered(completion("<think>Use the tool.</think>", "tool_calls", (call,))))
    assert m["content"] == [{"type": "thinking", "thinking": "Use the tool.", "signature": "llamactor"},
                            {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}}]
    assert m["stop_reason"] == "tool_use" and m["stop_sequence"] is None
    assert (m["id"], m["model"], m["role"]) == ("msg_test", "m", "assistant")
    assert m["usage"] == {"input_tokens": 12, "output_tokens": 5, "cache_creation_input_tokens": 0,
                          "cache_read_input_tokens": 8}
    assert message(messages_of(), completion(""))["content"] == [{"type": "text", "text": ""}]


def sse_bytes(pieces: list[str], done: Completion | LlamactorError, tools: Any = None) -> bytes:
    """The message's events as the transport frames them."""
    p = messages_of(tools=[WEATHER]) if tools else messages_of()
    return framed(message_events(p, updates(pieces, done, p.request)), ANTHROPIC_SSE, stream_error).encode()


def sdk_client(body: bytes) -> anthropic.Anthropic:
    transport = http.MockTransport(lambda _r: http.Response(200, content=body,
                                                               headers={"content-type": "text/event-stream"}))
    return anthropic.Anthropic(api_key="k", base_url="http://test", http_client=http.Client(transport=transport))


def test_the_sdk_stream_helper_rebuilds_thinking_text_and_a_tool_call_from_the_events() -> None:
    pieces = ["<thi", "nk>Paris is", " sunny?</think>", "Let me check.", "<tool_call>\n{\"name\": \"get_weather\", ",
              "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"]
    body = sse_bytes(pieces, completion("", "tool_calls", generated=7), tools=True)
    frames = [f for f in body.decode().split("\n\n") if f]
    assert all(f.startswith("event: ") for f in frames)  # the SDK drops frames without an event name
    starts = [json.loads(f.split("data: ", 1)[1]) for f in frames if f.startswith("event: content_block_start")]
    assert [s["index"] for s in starts] == [0, 1, 2]  # a call after text is a call too, as in a whole answer
    with sdk_client(body).messages.stream(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].thinking == "Paris is sunny?" and final.content[1].text == text == "Let me check."
    assert final.content[2].input == {"city": "Paris"}
    # An answer that is only a call: a tool_use block with an object input, arguments in one delta.
    body = sse_bytes(pieces[4:], completion("", "tool_calls", generated=7), tools=True)
    with sdk_client(body).messages.stream(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["tool_use"] and final.stop_reason == "tool_use"
    assert final.content[0].input == {"city": "Paris"} and final.content[0].id.startswith("toolu_")
    assert final.usage.output_tokens == 7 and final.usage.input_tokens + final.usage.cache_read_input_tokens == 20


def test_an_error_after_the_stream_began_is_an_error_event_the_sdk_raises() -> None:
    body = sse_bytes(["Hello"], LlamactorError("the batcher crashed"))
    assert body.decode().endswith('event: error\ndata: {"type": "error", "error": {"type": "api_error", '
                                  '"message": "the batcher crashed"}}\n\n')
    with pytest.raises(anthropic.APIStatusError, match="the batcher crashed"):
        with sdk_client(body).messages.stream(model="m", max_tokens=16,
                                              messages=[{"role": "user", "content": "x"}]) as s:
            s.get_final_message()


def test_pings_fill_the_silence_and_closing_early_closes_the_events() -> None:
    async def run() -> tuple[list[Any], bool]:
        go, closed = asyncio.Event(), asyncio.Event()

        async def events() -> AsyncGenerator[dict[str, Any], None]:
            try:
                await go.wait()
                yield {"type": "message_start"}
                await asyncio.Event().wait()  # never: the consumer leaves first
            finally:
                closed.set()
        got: list[Any] = []
        stream = with_keepalive(events(), 0.01)
        async for item in stream:
            got.append(item)
            if item is None:
                go.set()
            else:
                break
        await stream.aclose()
        return got, closed.is_set()
    got, closed = asyncio.run(run())
    assert got[0] is None and got[-1] == {"type": "message_start"} and closed
