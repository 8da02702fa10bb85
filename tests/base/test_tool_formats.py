"""Each model's own tool-call format, model-free: learned from a template by the probe, written,
parsed whole and streamed (the two always agree), and turned into a grammar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamactor.base.chat_template import ChatTemplate
from llamactor.base.tool_format import FALLBACK, HERMES, LLAMA3, MISTRAL, ToolCallFormat
from llamactor.base.tool_parser import ToolCallParser, json_end
from llamactor.base.tool_probe import read_format
from llamactor.base.tools import Tools, parse_tool_calls
from tests.support import TEMPLATES

pytestmark = pytest.mark.pure

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
# A template of no known family that renders calls in markers of its own.
OWN_MARKERS = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
               "{% if m.tool_calls is defined %}{% for c in m.tool_calls %}<function_call>"
               "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</function_call>"
               "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
               "{% if tools %}{{ tools | length }} tools{% endif %}")


def template(name: str) -> ChatTemplate:
    """A test template from tests/templates, as an override over SmolLM2's ChatML tokens."""
    return ChatTemplate(None, bos_token="", eos_token="<|im_end|>", override=(TEMPLATES / name).read_text())


@pytest.mark.parametrize("name, family, start, end, args_key, as_list", [
    ("hermes_tools.jinja", "hermes", "<tool_call>\n", "\n</tool_call>", "arguments", False),
    ("llama3_tools.jinja", "llama3", "", "", "parameters", False),
    ("mistral_tools.jinja", "mistral", "[TOOL_CALLS] ", "", "arguments", True),
])
def test_the_probe_reads_each_familys_format_off_its_template(name: str, family: str, start: str, end: str,
                                                              args_key: str, as_list: bool) -> None:
    fmt = template(name).tool_format
    assert (fmt.family, fmt.start, fmt.end, fmt.args_key, fmt.as_list, fmt.native) == (
        family, start, end, args_key, as_list, True)
    if family == "llama3":
        assert fmt.alt_starts == ("<|python_tag|>",)  # the family's opening the template shows only for built-ins


def test_a_template_with_markers_of_its_own_is_learned_as_it_writes_them() -> None:
    fmt = ChatTemplate(OWN_MARKERS, bos_token="", eos_token="<|im_end|>").tool_format
    assert (fmt.family, fmt.start, fmt.end, fmt.args_key) == ("learned", "<function_call>", "</function_call>",
                                                              "arguments")
    content, calls = parse_tool_calls('Checking.<function_call>{"name": "get_weather", "arguments": '
                                      '{"city": "Oslo"}}</function_call>', Tools.from_openai([WEATHER], format=fmt))
    assert content == "Checking." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"})]


def test_templates_that_know_no_tools_get_the_plain_text_fallback() -> None:
    assert template("think.jinja").tool_format == FALLBACK and not FALLBACK.native
    assert ChatTemplate(None, bos_token="", eos_token="").tool_format == FALLBACK  # the base model's transcript


def test_a_template_that_refuses_the_probe_falls_back_on_its_familys_markers() -> None:
    refusing = ("{% for m in messages %}{% if m.tool_calls is defined %}{{ raise_exception('no') }}{% endif %}"
                "{{ m.content }}{% endfor %}{% if tools is defined %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]")
    assert ChatTemplate(refusing, bos_token="", eos_token="").tool_format == MISTRAL
    assert ChatTemplate(refusing.replace("[TOOL_CALLS]", "<tool_call>"), bos_token="", eos_token="").tool_format == HERMES


def test_the_diff_keeps_whole_markers_and_leaves_the_turns_end_out() -> None:
    without = "<|im_start|>assistant\n<|im_end|>\n"
    # The shared "<" of "<tool_call>" and "<|im_end|>" must not cut the opening marker.
    with_call = '<|im_start|>assistant\n<tool_call>\n{"name": "probe_fn_QX7", "arguments": {"probe_arg_ZK9": "v"}}' \
                '\n</tool_call><|im_end|>\n'
    fmt = read_format(without, with_call, "<|im_end|>")
    assert fmt is not None and (fmt.start, fmt.end) == ("<tool_call>\n", "\n</tool_call>")
    assert read_format(without, '<|im_start|>assistant\nI would call probe_fn_QX7.<|im_end|>\n') is None


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3, MISTRAL], ids=lambda f: f.family)
def test_whole_and_streamed_answers_split_alike_wherever_the_pieces_break(fmt: ToolCallFormat) -> None:
    tools = Tools.from_openai([WEATHER], format=fmt)
    for text in (fmt.write([CALL]), "Let me look.\n" + fmt.write([CALL]), "No call here, {not json}.", " \n"):
        whole = parse_tool_calls(text, tools)
        for i in range(len(text) + 1):
            for j in range(i, len(text) + 1, 7):
                parser = ToolCallParser(fmt, ["get_weather"])
                parts = [parser.feed(p) for p in (text[:i], text[i:j], text[j:])] + [parser.finish()]
                content = "".join(p[0] for p in parts)
                calls = [c for p in parts for c in p[1]]
                assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole[1]], (text, i, j)
                assert (content.strip() if calls else content) == whole[0], (text, i, j)


@pytest.mark.parametrize("fmt, pieces, held", [
    (MISTRAL, ["Sure", " [TOOL_"], "Sure "),  # "[TOOL_" may become "[TOOL_CALLS]": held back
    (LLAMA3, ["  ", "<|pyth"], ""),  # blank, then the start of <|python_tag|>: nothing sent yet
    (LLAMA3, ['{"na'], ""),  # a bare JSON call may be beginning
    (LLAMA3, ["x {", '"a": 1}'], 'x {"a": 1}'),  # after text, JSON is content (no marker opened it)
    (HERMES, ["<tool", "_cal"], ""),
    (HERMES, ["<table>"], "<table>"),
])
def test_the_stream_parser_holds_back_only_what_may_still_open_a_call(fmt: ToolCallFormat, pieces: list[str],
                                                                      held: str) -> None:
    parser = ToolCallParser(fmt, ["get_weather"])
    assert "".join(parser.feed(p)[0] for p in pieces) == held


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>',  # no such tool
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',  # not JSON
    "<tool_call> is how I would write it",  # no JSON after the marker
])
def test_a_block_that_is_no_call_of_a_known_tool_is_content_as_written(text: str) -> None:
    parser = ToolCallParser(HERMES, ["get_weather"])
    out = [parser.feed(text), parser.finish()]
    assert "".join(o[0] for o in out) == text and not any(o[1] for o in out)


def test_a_call_the_turns_end_closed_is_still_a_call_and_mistral_ids_fit_its_templates() -> None:
    _, calls = parse_tool_calls('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}',
                                Tools.from_openai([WEATHER]))
    assert [c.name for c in calls] == ["get_weather"]
    _, calls = parse_tool_calls(MISTRAL.write([CALL, CALL]), Tools.from_openai([WEATHER], format=MISTRAL))
    assert len(calls) == 2 and all(len(c.id) == 9 and c.id.isalnum() for c in calls)


def test_llama_calls_parse_with_the_python_tag_and_parameters_and_one_after_another() -> None:
    tools = Tools.from_openai([WEATHER], format=LLAMA3)
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Lima"}}; ' \
           '{"name": "get_weather", "parameters": {"city": "Quito"}}'
    content, calls = parse_tool_calls(text, tools)
    assert content == "" and [json.loads(c.arguments)["city"] for c in calls] == ["Lima", "Quito"]


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3, MISTRAL], ids=lambda f: f.family)
def test_each_formats_grammar_compiles_and_writes_its_markers_and_arguments_key(fmt: ToolCallFormat) -> None:
    for parallel in (False, True):
        grammar = Tools.from_openai([WEATHER], "required", parallel, format=fmt).grammar()
        assert grammar is not None and grammar.kind == "lark"
        assert f'"{fmt.args_key}"' in grammar.compiled and (fmt.start.strip() or "call") in grammar.compiled


def test_history_calls_are_written_back_in_the_models_format_where_the_template_cannot() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abc123XYZ", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    prepared = Tools.from_openai([WEATHER], format=LLAMA3).prepare([message], template_takes_tools=False)
    assert prepared[-1]["content"] == '{"name": "get_weather", "parameters": {"city": "Paris"}}'


def test_json_end_finds_where_a_value_closes_and_skips_strings() -> None:
    assert json_end('{"a": "}", "b": [1, {"c": "\\"]"}]} tail') == 34
    assert json_end('{"a": [1, 2') is None


def test_a_template_that_renders_no_system_message_gets_the_fallback_in_the_first_user_turn() -> None:
    refusing = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
                "{% endif %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}")
    gemma2_like = ChatTemplate(refusing, bos_token="", eos_token="")
    assert not gemma2_like.renders_system and template("hermes_tools.jinja").renders_system
    tools = Tools.from_openai([WEATHER])
    prepared = tools.prepare([{"role": "user", "content": "Weather in Paris?"}], False, gemma2_like.renders_system)
    rendered = gemma2_like.render(prepared)
    assert rendered.startswith("<start_of_turn>user\nYou can call the following tools") and "Weather in Paris?" in rendered


def test_template_kwargs_cannot_replace_the_messages_or_tools_and_a_missing_tools_is_none() -> None:
    qwen_like = ChatTemplate("{% if tools %}T{% endif %}{{ messages[0].content }}", bos_token="", eos_token="")
    assert qwen_like.render([{"role": "user", "content": "x"}], template_kwargs={"messages": [], "tools": [1]}) == "x"
