"""Tool calls round-trip in each family's own format on SmolLM2-135M-Instruct, its template
overridden by one written for the tests in that family's format (tests/templates): a required or
named ``tool_choice`` makes the model write a call the way that template writes one, and the
parser reads it back -- whole, and streamed piece by piece; once through the OpenAI SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import llamactor
from llamactor.base.answer import AnswerSplitter

from tests.support.daemon import API_KEY, Daemon, start_daemon
from tests.support import TEMPLATES

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FAMILIES = {"hermes": "hermes_tools.jinja", "llama3": "llama3_tools.jinja", "mistral": "mistral_tools.jinja"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_llm(request: pytest.FixtureRequest, instruct_path: str) -> Iterator[tuple[str, llamactor.LLM]]:
    """SmolLM2 under the family's test template (one tree per family, shared by its tests)."""
    llm = llamactor.start(instruct_path, n_parallel=2, n_ctx=2048, batch_timeout_ms=5,
                          chat_template=(TEMPLATES / FAMILIES[request.param]).read_text())
    yield request.param, llm
    llm.close()


def written_in_family(raw: str, family: str, name: str = "get_weather") -> bool:
    """The raw answer is one call of ``name`` as the family writes it (the grammar writes compact JSON)."""
    text = raw.strip()
    opening, closing, key = {"hermes": ("<tool_call>\n", "\n</tool_call>", "arguments"),
                             "mistral": ("[TOOL_CALLS] ", "", "arguments"), "llama3": ("", "", "parameters")}[family]
    if not (text.startswith(opening) and text.endswith(closing)):
        return False
    value = json.loads(text[len(opening):len(text) - len(closing)])
    call = value[0] if family == "mistral" and isinstance(value, list) and len(value) == 1 else value
    return isinstance(call, dict) and set(call) == {"name", key} and call["name"] == name


def test_the_model_learns_its_templates_format_and_a_required_call_round_trips_whole(family_llm) -> None:
    family, llm = family_llm
    assert llm.info.tool_format.family == family and llm.info.tool_format.native
    c = llm.chat(ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=64)
    assert c.finish_reason == "tool_calls" and c.raw_text is not None and written_in_family(c.raw_text, family)
    assert [t.name for t in c.tool_calls] in (["get_weather"], ["get_time"]) and c.text == ""
    args = json.loads(c.tool_calls[0].arguments)
    assert isinstance(args, dict) and set(args) <= {"city", "zone"}


def test_a_named_call_streams_in_the_family_format_and_the_stream_parser_reads_what_the_whole_parse_read(
        family_llm) -> None:
    family, llm = family_llm
    request = llm.request(messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=64,
                          tool_choice={"type": "function", "function": {"name": "get_time"}})
    [stream] = llm.stream(request)
    splitter = AnswerSplitter(request.parsed_tools)
    parts = [splitter.feed(piece) for piece in stream] + [splitter.finish()]
    calls = [c for p in parts for c in p.calls]
    whole = stream.completion
    assert whole.raw_text is not None and written_in_family(whole.raw_text, family, "get_time")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        (c.name, json.loads(c.arguments)) for c in whole.tool_calls]
    assert [c.name for c in calls] == ["get_time"] and json.loads(calls[0].arguments)["zone"] in ("UTC", "CET")
    assert "".join(p.content for p in parts).strip() == ""


def test_the_rendered_prompt_carries_the_tools_in_the_familys_own_words(family_llm) -> None:
    family, llm = family_llm
    text = llm.tokenize(ASK, tools=[WEATHER]).text
    marker = {"hermes": "<tools>", "llama3": '"parameters": dictionary', "mistral": "[AVAILABLE_TOOLS]"}[family]
    assert marker in text and "get_weather" in text and "You can call the following tools" not in text


def test_smollm2s_own_template_knows_no_tools_so_the_fallback_goes_into_the_system_turn_it_renders(
        instruct_path: str) -> None:
    llm = llamactor.start(instruct_path, n_parallel=1, n_ctx=2048)
    try:
        assert llm.info.tool_format.family == "fallback"
        text = llm.tokenize(ASK, tools=[WEATHER]).text
        assert text.startswith("<|im_start|>system\nYou can call the following tools") and "SmolLM" not in text
        c = llm.chat(ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=64)
        assert c.raw_text is not None and c.raw_text.strip().startswith("<tool_call>")
        assert [t.name for t in c.tool_calls] == ["get_weather"]
    finally:
        llm.close()


@pytest.fixture(scope="module")
def mistral_daemon(tmp_path_factory: pytest.TempPathFactory, instruct_path: str) -> Iterator[Daemon]:
    """SmolLM2 under the Mistral template, not loaded until its first request: a request planned
    before its model loaded is planned again, in the format the model turns out to write."""
    template = (TEMPLATES / FAMILIES["mistral"]).read_text()
    config = tmp_path_factory.mktemp("config") / "models.toml"
    config.write_text(f'[[models]]\nname = "mistral"\npath = "{instruct_path}"\nn_parallel = 2\npreload = false\n'
                      f"chat_template = '''{template}'''\n")  # a TOML literal string: kept as written
    d = start_daemon("--config", str(config), "--api-key", API_KEY, wait_ready=False)  # no model loads at start
    assert d.wait_for_log(lambda line: line.get("event") == "serving", timeout=120), d.log_lines[-5:]
    yield d
    assert d.stop() == 0


def test_the_openai_sdk_gets_mistral_format_calls_whole_and_streamed_from_a_model_its_first_request_loads(
        mistral_daemon: Daemon) -> None:
    client = mistral_daemon.client()
    assert httpx.get(f"{mistral_daemon.url}/health").json()["models"]["mistral"]["status"] == "unloaded"
    ask = {"model": "mistral", "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "temperature": 0,
           "max_tokens": 64}
    whole = client.chat.completions.create(**ask)
    [call] = whole.choices[0].message.tool_calls or []
    assert whole.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str) and len(call.id) == 9  # Mistral's ids
    chunks = list(client.chat.completions.create(**ask, stream=True))
    deltas = [t for ch in chunks if ch.choices for t in (ch.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function is not None and deltas[0].function.name == "get_weather"
    assert isinstance(json.loads("".join(d.function.arguments or "" for d in deltas if d.function))["city"], str)
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason in ("tool_calls", None)
