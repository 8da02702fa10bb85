"""Tool calls: the pure parsing and rendering (no model), then chat(tools=...) on the real model."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import llamactor
from llamactor import InvalidRequestError
from llamactor.base.tools import ToolCallStream, Tools, parse_tool_calls, render_history_message

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TOOLS = Tools.from_openai([WEATHER])
BLOCK = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.pure
def test_a_block_naming_a_known_tool_is_parsed_and_the_surrounding_text_kept() -> None:
    content, calls = parse_tool_calls(f"Let me check.\n{BLOCK}", TOOLS)
    assert content == "Let me check." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    text = '<tool_call>{"name": "unknown_tool", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, TOOLS) == (text, ())  # an unknown tool is not a call: the text stays


@pytest.mark.pure
def test_the_stream_parser_holds_back_a_possible_call_and_emits_it_whole() -> None:
    stream = ToolCallStream(TOOLS)
    pieces = [" <tool", "_call>\n{\"name\": \"get_weather\",", " \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"]
    results = [stream.feed(p) for p in pieces]
    assert [r[0] for r in results] == ["", "", ""]
    assert results[-1][1][0].name == "get_weather" and stream.finish() == ("", [])
    plain = ToolCallStream(TOOLS)
    assert plain.feed(" <t") == ("", []) and plain.feed("able> is HTML") == (" <table> is HTML", [])


@pytest.mark.pure
@pytest.mark.parametrize("tools, choice, message", [
    ([], None, "1 to 128"),
    ([{"type": "function", "function": {"name": "bad name"}}], None, "letters"),
    ([WEATHER], "sometimes", "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "other"}}, "not in tools"),
    ([WEATHER, WEATHER], None, "unique"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}], None, "json_schema"),
])
def test_bad_tools_or_tool_choice_are_invalid_requests(tools: list, choice: object, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        Tools.from_openai(tools, choice)


@pytest.mark.pure
def test_history_calls_become_blocks_for_templates_without_tools_and_stay_structured_otherwise() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert render_history_message(message, False)["content"] == BLOCK
    structured = render_history_message(message, True)
    assert structured["content"] == "" and structured["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    prepared = TOOLS.prepare([{"role": "user", "content": "hi"}], template_takes_tools=False)
    assert prepared[0]["role"] == "system" and "get_weather" in prepared[0]["content"]


@pytest.mark.pure
def test_only_required_and_named_choices_constrain_the_answer() -> None:
    assert Tools.from_openai([WEATHER], "auto").grammar() is None
    assert Tools.from_openai([WEATHER], "none").grammar() is None
    assert Tools.from_openai([WEATHER], "required").grammar() is not None


@pytest.fixture(scope="module")
def instruct_llm(instruct_path: str) -> Iterator[llamactor.LLM]:
    """SmolLM2-135M-Instruct: its template knows no tools, so they go into the system turn it renders."""
    handle = llamactor.start(instruct_path, n_parallel=2, n_ctx=2048, batch_timeout_ms=5)
    yield handle
    handle.close()


@pytest.mark.parametrize("which", ["llm", "instruct_llm"])
def test_chat_with_a_forced_tool_returns_tool_calls_and_the_history_goes_on(request: pytest.FixtureRequest,
                                                                            which: str) -> None:
    llm: llamactor.LLM = request.getfixturevalue(which)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    c = llm.chat(ask, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 temperature=0, max_tokens=64)
    assert c.finish_reason == "tool_calls" and c.tool_calls[0].name == "get_weather"
    assert isinstance(json.loads(c.tool_calls[0].arguments)["city"], str) and c.raw_text and c.text == ""
    history = ask + [{"role": "assistant", "content": None, "tool_calls": [t.to_openai() for t in c.tool_calls]},
                     {"role": "tool", "tool_call_id": c.tool_calls[0].id, "content": "18 C"}]
    after = llm.chat(history, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=16)
    assert after.tool_calls == () and after.usage.prompt_tokens > c.usage.prompt_tokens
    with pytest.raises(InvalidRequestError, match="chat"):
        llm.submit("raw prompt", tools=[WEATHER])


@pytest.mark.pure
def test_a_template_that_renders_tools_gets_them_as_its_tools_variable() -> None:
    from llamactor.base.chat_template import ChatTemplate

    source = ("{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
              "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    template = ChatTemplate(source, bos_token="<bos>", eos_token="<eos>")
    assert template.takes_tools and not ChatTemplate(None, bos_token="", eos_token="").takes_tools
    messages = TOOLS.prepare([{"role": "user", "content": "hi"}], template.takes_tools)
    assert template.render(messages, tools=TOOLS.template_tools()) == "[get_weather]user: hi\n"
