"""Validation at the edge through a real daemon: what used to kill the batcher (``seed: -1``, a lone
surrogate, an earlier turn's malformed ``tool_calls``) or cost it unbounded work (60,001 messages,
a deep schema, a huge grammar, long stops) is a 400 in each dialect's own error shape -- sent
through the official openai, anthropic and ollama clients, and httpx for llama-server's routes --
and the daemon goes on serving, its batcher never restarted.

The SDKs cannot send a lone surrogate (httpx encodes bodies as strict UTF-8), so those bodies go
as raw JSON text with a ``\\ud800`` escape: what any other client may send.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support.daemon import MODEL_ID, Daemon, start_daemon

ESCAPED_LONE = "\\ud800"  # in JSON text: a valid escape, but no character
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "2")
    yield d
    assert d.stop() == 0


@pytest.fixture
def serving(daemon: Daemon) -> Iterator[Daemon]:
    """The daemon, checked after the test: no batcher failed or restarted, and it still answers."""
    yield daemon
    answer = daemon.client("any").completions.create(model=MODEL_ID, prompt="The sky is", max_tokens=2)
    assert answer.usage is not None and answer.usage.completion_tokens >= 1
    assert not daemon.events("batcher_failed") and not daemon.events("supervisor_gave_up")


def raw_post(daemon: Daemon, path: str, body_json: str) -> httpx.Response:
    return httpx.post(f"{daemon.url}{path}", content=body_json.encode("ascii"),
                      headers={"content-type": "application/json"}, timeout=60)


def nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_a_negative_seed_means_random_on_every_route_and_beyond_64_bits_is_a_400(serving: Daemon) -> None:
    client = serving.client("any")
    chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=3, seed=-1)
    assert chat.choices[0].finish_reason in ("length", "stop")
    streamed = client.completions.create(model=MODEL_ID, prompt="Once upon", max_tokens=3, seed=-1, n=2, stream=True)
    assert {c.choices[0].index for c in streamed if c.choices} == {0, 1}
    llama = httpx.post(f"{serving.url}/completions", json={"prompt": "Once upon", "max_tokens": 3, "seed": -1}, timeout=60)
    assert llama.status_code == 200 and llama.json()["choices"][0]["text"]
    answer = ollama.Client(host=serving.url).generate(model=MODEL_ID, prompt="Once upon", raw=True,
                                                      options={"seed": -1, "num_predict": 3})
    assert answer.done
    with pytest.raises(openai.BadRequestError, match="seed must be below 2\\*\\*64"):
        client.completions.create(model=MODEL_ID, prompt="x", max_tokens=1, seed=2**64)


@pytest.mark.parametrize("path, body, where", [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi LONE"}], "max_tokens": 2}',
     "messages[0].content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "LONE"}]}]}',
     "messages[0].content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "stop": ["ok", "LONE"]}', "stop[1]"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
     '"function": {"name": "f", "description": "LONE"}}]}', "tools[0].function.description"),
    ("/v1/completions", '{"prompt": "LONE", "max_tokens": 2}', "prompt"),
    ("/completions", '{"prompt": "x", "grammar": "root ::= \\"LONE\\""}', "grammar"),
    ("/v1/embeddings", '{"input": ["fine", "LONE"]}', "input[1]"),
    ("/tokenize", '{"content": "a LONE b"}', "content"),
    ("/tokenize", '{"messages": [{"role": "user", "content": "LONE"}]}', "messages[0].content"),
    ("/apply-template", '{"messages": [{"role": "user", "content": "LONE"}]}', "messages[0].content"),
])
def test_a_lone_surrogate_is_an_openai_shaped_400_naming_where(serving: Daemon, path: str, body: str,
                                                               where: str) -> None:
    reply = raw_post(serving, path, body.replace("LONE", ESCAPED_LONE))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["message"].startswith(f"{where} holds a lone surrogate") and error["param"] == where
    assert error["type"] == "invalid_request_error"


def test_a_lone_surrogate_is_a_400_in_anthropics_and_ollamas_shapes(serving: Daemon) -> None:
    anthropic_reply = raw_post(serving, "/v1/messages", '{"model": "m", "max_tokens": 4, "messages": [{"role": "user", '
                               f'"content": [{{"type": "text", "text": "x{ESCAPED_LONE}"}}]}}]}}')
    assert anthropic_reply.status_code == 400
    body = anthropic_reply.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "lone surrogate" in body["error"]["message"]
    counted = raw_post(serving, "/v1/messages/count_tokens", '{"model": "m", "messages": [{"role": "user", '
                       f'"content": "{ESCAPED_LONE}"}}]}}')
    assert counted.status_code == 400 and "lone surrogate" in counted.json()["error"]["message"]
    for path, body_json in (("/api/chat", f'{{"model": "{MODEL_ID}", "messages": [{{"role": "user", '
                                          f'"content": "{ESCAPED_LONE}"}}]}}'),
                            ("/api/generate", f'{{"model": "{MODEL_ID}", "prompt": "{ESCAPED_LONE}"}}'),
                            ("/api/embed", f'{{"model": "{MODEL_ID}", "input": "{ESCAPED_LONE}"}}')):
        reply = raw_post(serving, path, body_json)
        assert reply.status_code == 400 and "lone surrogate" in reply.json()["error"], (path, reply.text)


@pytest.mark.parametrize("tools", [[WEATHER], None])
@pytest.mark.parametrize("call, where", [
    ({"id": "c1", "type": "function"}, "messages[1].tool_calls[0] must be"),
    ({"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": 7}},
     "messages[1].tool_calls[0].function.arguments must be"),
])
def test_malformed_earlier_tool_calls_are_a_400_naming_the_message(serving: Daemon, tools: Any, call: dict[str, Any],
                                                                   where: str) -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    with pytest.raises(openai.BadRequestError) as refused:
        serving.client("any").chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2,  # type: ignore[arg-type]
                                                       **({"tools": tools} if tools else {}))
    assert refused.value.body["message"].startswith(where)  # type: ignore[index]
    template = httpx.post(f"{serving.url}/apply-template", json={"messages": messages, "tools": tools}, timeout=60)
    assert template.status_code == 400 and template.json()["error"]["message"].startswith(where)


def test_a_deep_schema_and_a_huge_grammar_are_400s_with_a_reason_in_every_dialect(serving: Daemon) -> None:
    deep = nested_schema(300)
    with pytest.raises(openai.BadRequestError, match="nests more than 64 levels"):
        serving.client("any").chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "JSON please"}], max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "deep", "schema": deep}})
    with pytest.raises(anthropic.BadRequestError, match="nests more than 64 levels"):
        anthropic.Anthropic(base_url=serving.url, api_key="any", max_retries=0).messages.create(
            model=MODEL_ID, max_tokens=4, messages=[{"role": "user", "content": "Weather?"}],
            tools=[{"name": "get_weather", "input_schema": deep}])  # type: ignore[list-item]
    with pytest.raises(ollama.ResponseError, match="nests more than 64 levels") as refused:
        ollama.Client(host=serving.url).chat(model=MODEL_ID, messages=[{"role": "user", "content": "JSON"}],
                                             format=deep)
    assert refused.value.status_code == 400
    alternatives = "root ::= " + " | ".join(f'"w{i}"' for i in range(25_000))
    huge = httpx.post(f"{serving.url}/completions", json={"prompt": "A word:", "grammar": alternatives}, timeout=60)
    assert huge.status_code == 400 and "at most 32768" in huge.json()["error"]["message"]
    broken = httpx.post(f"{serving.url}/completions", json={"prompt": "x", "grammar": 'root ::= "a" nowhere'}, timeout=60)
    assert broken.status_code == 400 and "Traceback" not in broken.text


def test_a_grammar_that_outgrows_the_parser_while_generating_is_a_400_with_one_line(serving: Daemon) -> None:
    """Under the size cap, 2,001 alternatives compile but overflow llguidance's row limit at the
    first token: the caller's grammar, so a 400 with llguidance's first line, not pages of state."""
    alternatives = "root ::= " + " | ".join(f'"w{i}"' for i in range(2001))
    failed = httpx.post(f"{serving.url}/completions", json={"prompt": "A word:", "grammar": alternatives,
                                                            "max_tokens": 4}, timeout=120)
    assert failed.status_code == 400, failed.text
    message = failed.json()["error"]["message"]
    assert "max is 2000" in message and len(message) < 500 and "\n" not in message


def test_long_stops_and_too_many_messages_are_400s_before_any_work(serving: Daemon) -> None:
    with pytest.raises(openai.BadRequestError, match="stop\\[0\\] is 300 characters long: at most 256"):
        serving.client("any").completions.create(model=MODEL_ID, prompt="x", max_tokens=2, stop=["x" * 300])
    with pytest.raises(anthropic.BadRequestError, match="at most 256"):
        anthropic.Anthropic(base_url=serving.url, api_key="any", max_retries=0).messages.create(
            model=MODEL_ID, max_tokens=4, messages=[{"role": "user", "content": "Hi"}], stop_sequences=["y" * 257])
    with pytest.raises(ollama.ResponseError, match="at most 256"):
        ollama.Client(host=serving.url).generate(model=MODEL_ID, prompt="x", options={"stop": ["z" * 500]})
    over = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}] * 2048 + [
        {"role": "user", "content": "and now?"}]
    with pytest.raises(openai.BadRequestError, match="4097 messages: at most 4096"):
        serving.client("any").chat.completions.create(model=MODEL_ID, messages=over, max_tokens=2)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError, match="at most 4096"):
        anthropic.Anthropic(base_url=serving.url, api_key="any", max_retries=0).messages.create(
            model=MODEL_ID, max_tokens=2, messages=over)  # type: ignore[arg-type]
    # The 60,001 messages (sent raw: the openai SDK alone spends ~18 s preparing them):
    # refused in the time it takes to read the body, where rendering them on the batcher took 51 s.
    start = time.monotonic()
    reply = httpx.post(f"{serving.url}/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}] * 60_001, "max_tokens": 2})
    assert reply.status_code == 400 and "60001 messages" in reply.json()["error"]["message"]
    assert time.monotonic() - start < 15


def test_a_batch_job_runs_a_seed_minus_one_line_and_fails_only_the_bad_lines(serving: Daemon) -> None:
    client = serving.client("any")

    def line(custom_id: str, **body: Any) -> str:
        return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                           "body": {"model": MODEL_ID, "max_tokens": 3, **body}})  # ensure_ascii: "\ud800" escaped

    chat = [{"role": "user", "content": "Hi"}]
    data = "\n".join([line("random", messages=chat, seed=-1),
                      line("surrogate", messages=[{"role": "user", "content": "\ud800"}]),
                      line("deep", messages=chat, response_format={"type": "json_schema", "json_schema": {
                          "name": "d", "schema": nested_schema(300)}}),
                      line("plain", messages=chat)]) + "\n"
    file_id = client.files.create(file=("in.jsonl", io.BytesIO(data.encode("ascii"))), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert serving.wait_for_log(lambda e: e.get("event") == "job_finished" and e.get("batch_id") == batch.id, 120)
    done = client.batches.retrieve(batch.id)
    assert done.request_counts is not None and (done.request_counts.completed, done.request_counts.failed) == (2, 2)
    assert done.output_file_id is not None and done.error_file_id is not None
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in output) == ["plain", "random"]
    errors = {e["custom_id"]: e for e in map(json.loads, client.files.content(done.error_file_id).text.splitlines())}
    assert "lone surrogate" in json.dumps(errors["surrogate"]) and "nests more than 64" in json.dumps(errors["deep"])
