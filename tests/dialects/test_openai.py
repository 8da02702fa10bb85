"""The dialects layer without a model: the typed request built once, the one answer splitter, the
one stream framing and its error policy, read back by the official clients' own parsers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx
import openai
import pytest

from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import BatcherRestartedError, InvalidRequestError
from llamactor.base.request import GenerationRequest
from llamactor.base.tools import ToolCall, Tools, parse_tool_calls
from llamactor.base.answer import AnswerSplitter
from llamactor.dialects.openai.call import chat_call, completions_call
from llamactor.dialects.openai.events import chat_events, completion_events, stream_error
from llamactor.dialects.openai.schema import ChatRequest, CompletionRequest
from llamactor.http.framing import NDJSON, OPENAI_SSE
from llamactor.http.middleware import JsonBodies

from tests.support.dialects import CTX, collect, completion, framed, sse_data, updates

pytestmark = pytest.mark.pure

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HI = [{"role": "user", "content": "hi"}]


# -- the typed request ----------------------------------------------------------------------

def test_a_request_is_checked_when_it_is_built_and_says_what_is_wrong() -> None:
    defaults = SamplingParams()
    for build, message in (
            (lambda: GenerationRequest.build(defaults, prompt="x", n=0), "n must be"),
            (lambda: GenerationRequest.build(defaults, prompt="x", temprature=1), "unknown sampling parameter"),
            (lambda: GenerationRequest.build(defaults, prompt="x", top_p=0), "top_p"),
            (lambda: GenerationRequest.build(defaults, prompt="x", tools=[WEATHER]), "tools need a chat"),
            (lambda: GenerationRequest.build(defaults, messages=HI, tool_choice="required"), "tool_choice needs tools"),
            (lambda: GenerationRequest.build(defaults, messages=HI, tools=[WEATHER], tool_choice="required",
                                             json_schema={"type": "object"}), "cannot be combined"),
            (lambda: GenerationRequest.build(defaults, prompt="x", echo=True), "pass logprobs"),
            (lambda: GenerationRequest.build(defaults, prompt=[]), "must not be empty"),
            (lambda: GenerationRequest.build(defaults, prompt="x", priority="urgent"), "priority")):
        with pytest.raises(InvalidRequestError, match=message):
            build()


def test_a_request_resolves_its_options_over_the_defaults_once_and_numbers_its_choices() -> None:
    r = GenerationRequest.build(SamplingParams(temperature=0.3, max_tokens=9), messages=HI, n=3, seed=5, top_k=2,
                                tools=[WEATHER], tool_choice="required", priority="low", echo=False)
    assert (r.params.temperature, r.params.max_tokens, r.params.top_k, r.priority) == (0.3, 9, 2, 2)
    assert r.tools is not None and r.params.grammar is not None and r.parsed_tools is r.tools  # the tools' grammar
    msgs = r.generate_messages("req", [None] * 3, 0.0)  # type: ignore[list-item]
    assert [m.request_id for m in msgs] == ["req-0", "req-1", "req-2"]
    assert [m.params.seed for m in msgs] == [5, 6, 7] and all(m.tools is r.tools for m in msgs)
    echo = GenerationRequest.build(SamplingParams(), prompt=[1, 2], echo=True, logprobs=3)
    assert echo.params.prompt_logprobs == 3 and echo.token_ids == (1, 2)


def test_the_tool_grammar_closes_argument_objects_and_bounds_numbers() -> None:
    grammar = Tools.from_openai([WEATHER], "required").grammar()
    assert grammar is not None
    body = json.loads(grammar.compiled.split("body: %json ", 1)[1].splitlines()[0])
    arguments = body["anyOf"][0]["properties"]["arguments"]
    assert arguments["additionalProperties"] is False  # {"city": ..., "type": "object"} can no longer be drawn
    assert arguments["properties"]["days"]["maximum"] == 10**16  # as json_schema bounds numbers


# -- the one answer splitter ----------------------------------------------------------------

@pytest.mark.parametrize("raw", ["Paris.", "<think>Hm.</think>Paris.", "<think>Hm.</think>" + CALL, CALL,
                                 CALL + "\n" + CALL.replace("Paris", "Rome"), "<think>unfinished", "<tool_ca"])
def test_a_streamed_answer_splits_as_the_whole_answer_does_however_it_is_cut(raw: str) -> None:
    tools = Tools.from_openai([WEATHER], parallel_tool_calls=True)
    at_once = AnswerSplitter(tools)
    at_once.feed(raw)
    whole = at_once.whole(raw, calls_count=True)
    assert whole.text == parse_tool_calls(raw, tools)[0]  # the Completion's text, as the whole text's parse has it
    for cut in range(len(raw) + 1):
        splitter = AnswerSplitter(tools)
        parts = [splitter.feed(raw[:cut]), splitter.feed(raw[cut:])]
        ended = splitter.whole(raw, calls_count=True)
        parts.append(ended.last)
        assert "".join(p.reasoning for p in parts).strip() == (whole.answer.reasoning or ""), cut
        assert "".join(p.content for p in parts).strip() == whole.answer.content.strip(), cut
        assert [(c.name, c.arguments) for p in parts for c in p.calls] == [(c.name, c.arguments) for c in whole.calls]
        assert ended.text == whole.text, cut


# -- the one framing, the one error policy --------------------------------------------------

def openai_client(body: str) -> openai.OpenAI:
    transport = httpx.MockTransport(lambda _r: httpx.Response(200, content=body.encode(),
                                                              headers={"content-type": "text/event-stream"}))
    return openai.OpenAI(api_key="k", base_url="http://test/v1", http_client=httpx.Client(transport=transport))


def chat_of(**fields: Any) -> Any:
    return chat_call(ChatRequest.model_validate({"messages": HI, **fields}), CTX)


@pytest.mark.parametrize("failure", [BatcherRestartedError("the replica died"), RuntimeError("a bug")])
def test_a_failure_after_the_first_chunk_is_an_error_event_then_done_and_the_sdk_raises(failure: Exception) -> None:
    body = framed(chat_events(chat_of(), updates(["Hel", "lo"], failure)), OPENAI_SSE, stream_error)
    data = sse_data(body)
    assert data[-1] == "[DONE]" and "error" in data[-2]
    assert data[-2]["error"]["message"] == ("the replica died" if isinstance(failure, BatcherRestartedError)
                                             else "internal server error")  # nothing of a bug's own text
    seen = []
    with pytest.raises(openai.APIError):
        for chunk in openai_client(body).chat.completions.create(model="m", messages=HI, stream=True):  # type: ignore[arg-type]
            seen.append(chunk.choices[0].delta.content or "")
    assert "".join(seen) == "Hello"


def test_completions_usage_comes_last_in_a_chunk_of_its_own_and_only_when_asked() -> None:
    def chunks(**fields: Any) -> list[dict[str, Any]]:
        body = CompletionRequest.model_validate({"prompt": "Once", "stream": True, **fields})
        return collect(completion_events(completions_call(body, CTX), updates([" upon", " a"], completion(" upon a"))))
    asked = chunks(stream_options={"include_usage": True})
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] == 5
    assert asked[-2]["choices"][0]["finish_reason"] == "stop" and "usage" not in asked[-2]
    assert not any("usage" in c for c in chunks())


def test_ndjson_is_one_compact_object_a_line_and_an_unexpected_failure_is_one_more_line() -> None:
    async def lines() -> AsyncGenerator[dict[str, Any], None]:
        yield {"a": 1}
        raise KeyError("a bug")
    text = framed(lines(), NDJSON, lambda e: [{"error": "internal server error"}])
    assert text == '{"a":1}\n{"error":"internal server error"}\n'


# -- JSON bodies whatever their Content-Type ------------------------------------------------

@pytest.mark.parametrize(("declared", "seen"), [
    (None, b"application/json"), (b"application/x-www-form-urlencoded", b"application/json"),
    (b"text/plain", b"application/json"), (b"application/json; charset=utf-8", b"application/json; charset=utf-8"),
    (b"multipart/form-data; boundary=x", b"multipart/form-data; boundary=x")])
def test_a_body_is_read_as_json_whatever_it_declares_but_an_upload_stays_multipart(declared: bytes | None,
                                                                                   seen: bytes) -> None:
    got: list[bytes | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got.append(dict(scope["headers"]).get(b"content-type"))
    headers = [(b"content-type", declared)] if declared else []
    asyncio.run(JsonBodies(app)({"type": "http", "method": "POST", "headers": headers}, None, None))
    assert got == [seen]


def test_a_tool_call_streamed_whole_keeps_its_id_as_the_chunks_index() -> None:
    required = chat_of(tools=[WEATHER], tool_choice="required", parallel_tool_calls=True)
    calls = (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)
    chunks = collect(chat_events(required, updates([CALL, "\n", CALL], completion("", "tool_calls", calls), required.request)))
    deltas = [t for c in chunks for choice in c["choices"] for t in choice["delta"].get("tool_calls", [])]
    assert [d["index"] for d in deltas] == [0, 1] and {d["function"]["name"] for d in deltas} == {"get_weather"}
