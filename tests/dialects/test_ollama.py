"""The Ollama dialect's translation, model-free: options, durations, messages, tool calls,
thinking, NDJSON lines, and GGUF headers, checked against the ``ollama`` client's own types."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ollama
import pytest

from llamactor.base.completion import Completion, TokenLogprob, Timings, Usage
from llamactor.base.errors import BatcherRestartedError, InvalidRequestError
from llamactor.base.tools import ToolCall
from llamactor.dialects.ollama.call import OllamaCall, chat_call, chat_messages, generate_call
from llamactor.dialects.ollama.replies import answer_lines, done_fields, logprobs, stream_error, tool_calls, whole_answer
from llamactor.dialects.ollama.schema import ChatRequest, EmbedRequest, GenerateRequest, Message, Options, keep_alive_s
from llamactor.http.framing import NDJSON
from llamactor.native.gguf_header import human_number, read_gguf

from tests.support.dialects import CTX, answered, collect, framed, updates

pytestmark = pytest.mark.pure

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
HI = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> OllamaCall:
    asked = chat_call(ChatRequest.model_validate({"model": "m", "messages": HI, **fields}), CTX, 2048)
    assert asked is not None
    return asked


def completion(text: str, **kw: Any) -> Completion:
    return Completion("r", text, (1, 2, 3), kw.pop("finish_reason", "stop"), Usage(11, 3, 0),
                      Timings(queue_ms=1.0, ttft_ms=5.0, total_ms=20.0, decode_tokens_per_s=1.0), **kw)


def test_keep_alive_takes_seconds_and_go_durations_and_refuses_anything_else() -> None:
    assert [keep_alive_s(v) for v in (None, 0, "0", 30, "300", "5m", "1h30m", "250ms", "-1m", -1)] == [
        None, 0.0, 0.0, 30.0, 300.0, 300.0, 5400.0, 0.25, -60.0, -1.0]
    for bad in ("soon", "5 minutes", "m", ""):
        with pytest.raises(InvalidRequestError, match="keep_alive"):
            keep_alive_s(bad)


def test_options_map_onto_sampling_with_ollamas_special_values() -> None:
    config = 2048  # n_ctx
    assert Options().sampling(config) == {"max_tokens": None}  # Ollama's default: no limit
    for unlimited in (-1, -2, 0):
        assert Options(num_predict=unlimited).sampling(config)["max_tokens"] is None
    mapped = Options(num_predict=7, temperature=0, top_k=5, seed=-1, repeat_last_n=-1, stop="\n",
                     repeat_penalty=1.1).sampling(config)
    assert mapped == {"max_tokens": 7, "temperature": 0, "top_k": 5, "repeat_last_n": 2048, "stop": ["\n"],
                      "repeat_penalty": 1.1}  # seed -1: random, so none is set
    assert Options(seed=4).sampling(config)["seed"] == 4


def test_options_not_applied_are_named_unless_they_change_nothing() -> None:
    given = Options.model_validate({"num_ctx": 8192, "mirostat": 2, "mirostat_tau": 5.0, "typical_p": 0.5,
                                    "num_gpu": 1, "temperature": 0.1, "bogus": 1, "nothing": None})
    assert given.not_applied() == (["mirostat", "mirostat_tau", "num_ctx", "num_gpu", "typical_p"], ["bogus"])
    neutral = Options(mirostat=0, mirostat_tau=5.0, typical_p=1.0, tfs_z=1.0, penalize_newline=True, num_keep=4)
    assert neutral.not_applied() == ([], [])


def test_top_level_options_are_read_but_options_win() -> None:
    body = ChatRequest.model_validate({"model": "m", "temperature": 0.1, "top_k": 3, "options": {"temperature": 0.2},
                                       "whatever": True})
    assert (body.options.temperature, body.options.top_k, body.streamed) == (0.2, 3, True)
    with pytest.raises(ValueError):
        ChatRequest.model_validate({"model": "m", "options": {"temperature": "hot"}})
    assert ChatRequest.model_validate({"model": "m", "options": None, "top_p": 0.5}).options.top_p == 0.5
    assert EmbedRequest.model_validate({"model": "m", "options": None}).options == Options()


def test_format_think_and_logprobs_become_sampling_and_template_variables() -> None:
    asked = chat(format={"type": "object"}, think="high", logprobs=True, top_logprobs=2, stream=False)
    r = asked.request
    assert r.params.grammar is not None and r.params.grammar.kind == "json_schema" and not asked.streamed
    assert r.params.top_logprobs == 2 and asked.logprobs
    assert r.chat_template_kwargs == {"enable_thinking": True, "reasoning_effort": "high"}
    assert chat(think=False).request.chat_template_kwargs == {"enable_thinking": False}
    assert chat(format="json").request.params.grammar.kind == "json_object"  # type: ignore[union-attr]
    plain = chat(format="").request
    assert plain.params.grammar is None and plain.params.max_tokens is None and plain.chat_template_kwargs is None
    assert chat_call(ChatRequest(model="m"), CTX, 2048) is None  # no messages: the request only loads the model


def test_generate_refuses_what_it_cannot_do_in_ollamas_words() -> None:
    for fields, message in (({"raw": True, "system": "s"}, "raw mode does not support"),
                            ({"template": "{{ .Prompt }}"}, "template is not supported"),
                            ({"suffix": "end"}, "suffix"), ({"context": [1, 2]}, "context"),
                            ({"images": ["aGk="]}, "images")):
        with pytest.raises(InvalidRequestError, match=message):
            GenerateRequest(model="m", prompt="p", **fields).check()
    GenerateRequest(model="m", prompt="p", suffix="", context=[]).check()


def test_history_tool_calls_become_json_text_and_results_find_their_call() -> None:
    history = [Message(role="user", content="Weather in Paris and Rome?"),
               Message.model_validate({"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                   {"id": "call_rome", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]}),
               Message(role="tool", content="12C", tool_name="get_weather"),
               Message(role="tool", content="20C", tool_call_id="call_rome")]
    out = chat_messages(history, "m")
    calls = out[1]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert out[2]["tool_call_id"] == calls[0]["id"] and out[2]["name"] == "get_weather"
    assert out[3]["tool_call_id"] == "call_rome"
    with pytest.raises(InvalidRequestError, match="images"):
        chat_messages([Message(role="user", content="look", images=["aGk="])], "m")


def test_a_streamed_tool_call_reaches_the_ollama_client_with_arguments_as_an_object() -> None:
    pieces = ["<tool_", 'call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>']
    plan = chat(tools=WEATHER)
    lines = collect(answer_lines(plan, updates(pieces, completion("", finish_reason="tool_calls"), plan.request), 0))
    assert len(lines) == 2 and lines[-1]["done"]  # the call whole, then the final line
    parsed = ollama.ChatResponse(**lines[0])
    call = parsed.message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Paris"})
    odd = tool_calls([ToolCall("call_1", "f", '"just text"')])
    assert odd[0]["function"]["arguments"] == {"value": "just text"}  # never a string: the client refuses one


def test_thinking_is_split_from_content_and_dropped_when_not_wanted() -> None:
    pieces = ["<thi", "nk>Let me see.</th", "ink>Blue."]
    for think, expected in ((None, "Let me see."), (True, "Let me see."), (False, "")):
        plan = chat(think=think)
        lines = collect(answer_lines(plan, updates(pieces, completion(""), plan.request), 0))
        assert "".join(line["message"].get("thinking", "") for line in lines) == expected
        assert "".join(line["message"]["content"] for line in lines) == "Blue."
    raw = generate_call(GenerateRequest(model="m", prompt="p", raw=True), CTX, 2048)
    assert raw is not None
    lines = collect(answer_lines(raw, updates(["<think>x</think>y"], completion(""), raw.request), 0))
    assert lines[0]["response"] == "<think>x</think>y" and "thinking" not in lines[0]


def test_a_whole_answer_carries_counts_durations_and_logprobs_in_ollamas_shape() -> None:
    blue = TokenLogprob("Blue", -0.5, (("Blue", -0.5), ("Red", -1.5)))
    c = answered(completion("<think>hm</think>Blue.", logprobs=(blue,)))
    reply = whole_answer(chat(logprobs=True), c, 1000)
    parsed = ollama.ChatResponse(**reply)
    message = parsed.message
    assert (message.content, message.thinking, parsed.done, parsed.done_reason) == ("Blue.", "hm", True, "stop")
    assert (parsed.prompt_eval_count, parsed.eval_count) == (11, 3)
    durations = (parsed.total_duration, parsed.prompt_eval_duration, parsed.eval_duration)
    assert durations == (20_001_000, 4_000_000, 15_000_000)  # ns: total + load, ttft - queue, total - ttft
    assert parsed.logprobs[0].top_logprobs[1].token == "Red" and reply["logprobs"][0]["bytes"] == list(b"Blue")
    assert done_fields(completion("", finish_reason="context_full"), 0)["done_reason"] == "length"
    assert logprobs(None) == []


def test_an_error_after_the_stream_began_is_one_more_ndjson_line() -> None:
    lines = answer_lines(chat(), updates(["Hi"], BatcherRestartedError("the replica serving this stream died")), 0)
    text = framed(lines, NDJSON, stream_error)
    assert text.endswith("\n") and "\n\n" not in text
    first, last = (json.loads(line) for line in text.splitlines())
    assert first["message"]["content"] == "Hi" and last == {"error": "the replica serving this stream died"}


def test_parameter_sizes_read_as_ollama_prints_them() -> None:
    assert [human_number(n) for n in (268_098_176, 7_615_616_512, 8_000_000_000, 1_000_000, 12_345, 999)] == [
        "268.10M", "7.6B", "8B", "1M", "12K", "999"]


def gguf_bytes(kvs: list[tuple[str, int, bytes]], tensors: list[list[int]]) -> bytes:
    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, kind, value in kvs:
        out += string(key) + struct.pack("<I", kind) + value
    for i, dims in enumerate(tensors):
        out += string(f"t{i}") + struct.pack(f"<I{len(dims)}Q", len(dims), *dims) + struct.pack("<IQ", 0, 0)
    return out


def test_a_gguf_header_gives_typed_metadata_details_and_the_parameter_count(tmp_path: Path) -> None:
    tokens = struct.pack("<IQ", 8, 6) + b"".join(struct.pack("<Q", 1) + bytes([c]) for c in b"abcdef")
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes([
        ("general.architecture", 8, struct.pack("<Q", 5) + b"llama"), ("general.file_type", 4, struct.pack("<I", 15)),
        ("llama.context_length", 4, struct.pack("<I", 4096)), ("general.name", 8, struct.pack("<Q", 1) + b"x"),
        ("tokenizer.ggml.tokens", 9, tokens), ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 6) + b"\0" * 24),
        ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)), ("some.flag", 7, b"\x01"),
    ], [[1000, 1000], [7, 3, 2]]))
    gguf = read_gguf(str(path))
    assert gguf is not None and gguf.n_params == 1_000_042 and len(gguf.digest) == 64
    assert gguf.details() == {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
                              "parameter_size": "1.00M", "quantization_level": "Q4_K_M"}
    info = gguf.model_info()
    assert info["llama.context_length"] == 4096 and info["tokenizer.ggml.tokens"] == [] and info["some.flag"] is True
    assert "general.name" not in info and info["general.parameter_count"] == 1_000_042
    verbose = read_gguf(str(path), verbose=True)
    assert verbose is not None and verbose.metadata["tokenizer.ggml.tokens"] == list("abcdef")
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + b"\0" * 20)
    assert read_gguf(str(tmp_path / "bad.gguf")) is None and read_gguf(str(tmp_path / "missing.gguf")) is None
