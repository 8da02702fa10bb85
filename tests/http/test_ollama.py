"""Ollama's native API on the daemon's port, driven by the official ``ollama`` client (and raw
httpx where the wire format itself is the point). One daemon serves two models: the base Gemma as
``chat`` (the transcript) and SmolLM2-135M-Instruct as ``spare`` (its own template); the chat and
tool tests run on both; an unknown name is a 404, and ``spare`` can be unloaded and reloaded."""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import re
import subprocess
from collections.abc import Iterator

import httpx
import ollama
import pytest

from tests.support.daemon import (
    Daemon, assert_same_greedy_text_up_to_near_tie, chat_steps, metric, start_daemon,
)

HI = [{"role": "user", "content": "Say hi"}]
GREEDY = {"temperature": 0, "num_predict": 8}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def daemon(model_path: str, instruct_path: str) -> Iterator[Daemon]:
    # chat: the base Gemma (the transcript); spare: SmolLM2-135M-Instruct (its own ChatML template)
    d = start_daemon("--model", f"chat={model_path}", "--model", f"spare={instruct_path}")
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url)


@pytest.mark.parametrize("model", ["chat", "spare"])  # the transcript, and the instruct model's template
def test_chat_answers_whole_and_streamed_and_the_stream_ends_with_counts(client: ollama.Client, daemon: Daemon,
                                                                         model: str) -> None:
    whole = client.chat(model=model, messages=HI, options=GREEDY, logprobs=True, top_logprobs=2)
    assert whole.model == model and whole.done and whole.message.role == "assistant"
    assert whole.eval_count == len(whole.logprobs) and whole.prompt_eval_count > 3 and whole.total_duration > 0
    chunks = list(client.chat(model=f"{model}:latest", messages=HI, options=GREEDY, logprobs=True, top_logprobs=2,
                              stream=True))
    last = chunks[-1]
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True] and last.model == f"{model}:latest"
    assert last.message.content == "" and last.eval_count == sum(len(c.logprobs or []) for c in chunks)
    streamed_text = "".join(c.message.content for c in chunks)
    # The same greedy prompt decoded twice (the second from its cached prefix) agrees up to a near-tie.
    assert_same_greedy_text_up_to_near_tie(
        (streamed_text, chat_steps([lp for c in chunks for lp in c.logprobs or []]), last.done_reason),
        (whole.message.content, chat_steps(whole.logprobs), whole.done_reason))
    scraped = httpx.get(f"{daemon.url}/metrics").text
    counted = r'llamactor_generated_tokens_total\{(?=[^}]*model="' + model + r'")(?=[^}]*dialect="ollama")[^}]*\}'
    assert metric(scraped, counted) == whole.eval_count + last.eval_count


def test_a_stream_is_the_default_and_is_strict_ndjson(daemon: Daemon) -> None:
    r = httpx.post(f"{daemon.url}/api/chat", json={"model": "chat", "messages": HI, "options": GREEDY}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    assert r.text.endswith("\n") and "\n\n" not in r.text
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert all(line["message"]["role"] == "assistant" for line in lines) and lines[-1]["done"] is True
    assert {"done_reason", "total_duration", "load_duration", "prompt_eval_count", "eval_count"} <= set(lines[-1])


def test_generate_sends_a_raw_prompt_as_is_and_wraps_a_templated_one(client: ollama.Client, daemon: Daemon) -> None:
    prompt = "The capital of France is"
    raw = client.generate(model="chat", prompt=prompt, raw=True, options=GREEDY)
    openai_count = daemon.client(api_key="unused").completions.create(
        model="chat", prompt=prompt, max_tokens=1).usage.prompt_tokens
    assert raw.prompt_eval_count == openai_count and raw.response and raw.done_reason in ("stop", "length")
    templated = client.generate(model="chat", prompt=prompt, options=GREEDY)
    with_system = client.generate(model="chat", prompt=prompt, system="Answer in French.", options=GREEDY)
    assert raw.prompt_eval_count < templated.prompt_eval_count < with_system.prompt_eval_count
    thought = client.chat(model="chat", messages=HI, think=True, options=GREEDY)  # this base model does not think
    assert thought.done and thought.message.thinking is None
    streamed = list(client.generate(model="chat", prompt=prompt, raw=True, options=GREEDY, stream=True))
    assert streamed[-1].done and streamed[-1].response == "" and streamed[-1].prompt_eval_count == openai_count


def test_format_json_and_a_json_schema_constrain_the_answer(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["blue", "green", "grey"]}},
              "required": ["colour"], "additionalProperties": False}
    question = [{"role": "user", "content": "What colour is the sea? Answer in JSON."}]
    shaped = client.chat(model="chat", messages=question, format=schema, options={"temperature": 0, "num_predict": 32})
    assert shaped.done_reason == "stop" and json.loads(shaped.message.content)["colour"] in ("blue", "green", "grey")
    as_json = client.generate(model="chat", prompt="A JSON object describing the sea:", format="json",
                              options={"temperature": 0, "num_predict": 64})
    # JSON mode bounds nothing: an object may outgrow num_predict; one that ends is an object
    assert as_json.done_reason == "length" or isinstance(json.loads(as_json.response), dict)


@pytest.mark.parametrize("model", ["chat", "spare"])
def test_tools_are_rendered_and_a_tool_result_round_trips(client: ollama.Client, model: str) -> None:
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    plain = client.chat(model=model, messages=question, options={"num_predict": 1})
    with_tools = client.chat(model=model, messages=question, tools=[WEATHER_TOOL], options={"num_predict": 1})
    assert with_tools.prompt_eval_count > plain.prompt_eval_count + 20  # the tool's description is in the prompt
    history = question + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 degrees and sunny", "tool_name": "get_weather"}]
    answered = client.chat(model=model, messages=history, tools=[WEATHER_TOOL], options=GREEDY)
    assert answered.done and answered.prompt_eval_count > with_tools.prompt_eval_count + 10
    streamed = list(client.chat(model=model, messages=history, tools=[WEATHER_TOOL], options=GREEDY, stream=True))
    assert streamed[-1].done and streamed[-1].prompt_eval_count == answered.prompt_eval_count


def test_embed_normalizes_and_the_legacy_route_does_not(client: ollama.Client) -> None:
    vectors = client.embed(model="chat", input=["the sea", "the sky"]).embeddings
    assert len(vectors) == 2 and all(math.isclose(math.hypot(*v), 1.0, rel_tol=1e-4) for v in vectors)
    short = client.embed(model="chat", input="the sea", dimensions=64).embeddings
    assert len(short) == 1 and len(short[0]) == 64 and math.isclose(math.hypot(*short[0]), 1.0, rel_tol=1e-4)
    legacy = client.embeddings(model="chat", prompt="the sea").embedding
    norm = math.hypot(*legacy)
    assert len(legacy) == len(vectors[0]) and not math.isclose(norm, 1.0, rel_tol=1e-3)
    assert sum(a * b for a, b in zip(legacy, vectors[0])) / norm == pytest.approx(1.0, abs=1e-4)  # same direction
    assert client.embed(model="chat", input=[]).embeddings == []
    long_text = "waves " * 3000  # longer than an embedding step: truncated, as Ollama does by default
    assert len(client.embed(model="chat", input=long_text).embeddings[0]) == len(vectors[0])
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="chat", input=long_text, truncate=False)
    assert refused.value.status_code == 400


def test_list_show_ps_and_version_describe_the_served_models(client: ollama.Client, daemon: Daemon,
                                                             model_path: str) -> None:
    listed = {m.model: m for m in client.list().models}
    assert set(listed) == {"chat:latest", "spare:latest"}
    entry = listed["chat:latest"]
    assert entry.size == os.path.getsize(model_path) and re.fullmatch(r"[0-9a-f]{64}", entry.digest)
    details = entry.details
    assert (details.family, details.format, details.quantization_level) == ("gemma3", "gguf", "Q4_K_M")
    assert entry.details.parameter_size.endswith("M") and entry.modified_at is not None
    assert listed["spare:latest"].details.family == "llama"  # SmolLM2-135M-Instruct
    shown = client.show("chat:latest")
    assert shown.modelinfo["general.architecture"] == "gemma3" and shown.modelinfo["gemma3.context_length"] == 32768
    assert shown.capabilities == ["completion"] and "User:" in shown.template and "temperature" in shown.parameters
    version = httpx.get(f"{daemon.url}/api/version").json()["version"]
    assert tuple(map(int, version.split("."))) >= (0, 6, 4)  # what Open WebUI parses and Copilot requires
    assert httpx.head(f"{daemon.url}/api/version").status_code == 200
    assert httpx.head(f"{daemon.url}/api/tags").status_code == 200
    root = httpx.get(daemon.url)
    assert (root.status_code, root.text) == (200, "Ollama is running") and httpx.head(daemon.url).status_code == 200
    client.chat(model="chat", messages=HI, options={"num_predict": 1})
    running = {m.model: m for m in client.ps().models}
    assert "chat:latest" in running and running["chat:latest"].expires_at.year > 2100
    assert running["chat:latest"].context_length == 4096 and running["chat:latest"].size == entry.size
    assert client.pull("chat").status == "success"
    with pytest.raises(ollama.ResponseError) as refused:
        client.delete("chat")
    assert refused.value.status_code == 501


def test_keep_alive_zero_unloads_the_model_and_the_next_request_loads_it_again(client: ollama.Client,
                                                                              daemon: Daemon) -> None:
    loaded = httpx.post(f"{daemon.url}/api/generate", json={"model": "spare", "prompt": ""})  # no stream field
    assert loaded.headers["content-type"] == "application/json" and loaded.json()["done_reason"] == "load"
    unloaded = client.generate(model="spare", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload" and "spare:latest" not in {m.model for m in client.ps().models}
    assert httpx.get(f"{daemon.url}/health").json()["models"]["spare"]["status"] == "unloaded"
    again = client.chat(model="spare", messages=HI, options={"num_predict": 2})
    assert again.done and again.load_duration > 1_000_000  # it loaded (milliseconds at least)
    assert "spare:latest" in {m.model for m in client.ps().models}
    emptied = client.chat(model="spare", messages=[], keep_alive="0s")
    assert emptied.done_reason == "unload" and emptied.message.content == ""  # answered once unloaded
    assert "spare:latest" not in {m.model for m in client.ps().models}


def test_an_unknown_model_is_a_404_naming_it(client: ollama.Client, daemon: Daemon) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="poet", messages=HI)
    assert caught.value.status_code == 404 and caught.value.error.startswith("model 'poet' not found")
    nameless = httpx.post(f"{daemon.url}/api/generate", json={"prompt": "Hi"})  # the client refuses to send this
    assert (nameless.status_code, nameless.json()) == (400, {"error": "model is required"})
    with pytest.raises(ollama.ResponseError) as shown:
        client.show("poet:7b")
    assert shown.value.status_code == 404


def test_a_bad_option_is_a_400_and_loses_nothing_else(client: ollama.Client, daemon: Daemon) -> None:
    first_chunk = concurrent.futures.Future[None]()

    def stream_one() -> list[ollama.GenerateResponse]:
        chunks = []
        # a raw prompt (no turn marker to stop at) decoded for 32 tokens: in flight while the bad request comes
        for chunk in ollama.Client(host=daemon.url).generate(model="chat", prompt="Once upon a time", raw=True,
                                                             options={"num_predict": 32}, stream=True):
            chunks.append(chunk)
            if not first_chunk.done():
                first_chunk.set_result(None)
        return chunks

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        other = pool.submit(stream_one)
        concurrent.futures.wait([first_chunk, other], timeout=60, return_when=concurrent.futures.FIRST_COMPLETED)
        assert first_chunk.done(), f"the stream sent nothing: {other.exception() if other.done() else 'still waiting'}"
        with pytest.raises(ollama.ResponseError) as caught:
            client.chat(model="chat", messages=HI, options={"temperature": "hot"})
        assert caught.value.status_code == 400 and "options.temperature" in caught.value.error
        with pytest.raises(ollama.ResponseError) as bad_duration:
            client.chat(model="chat", messages=HI, keep_alive="soon")
        assert bad_duration.value.status_code == 400
        last = other.result(timeout=120)[-1]
        assert last.done and (last.done_reason == "stop" or last.eval_count == 32)


def test_a_prompt_over_the_context_is_a_400_before_the_stream(client: ollama.Client) -> None:
    too_long = [{"role": "user", "content": "waves " * 5000}]
    with pytest.raises(ollama.ResponseError) as caught:
        for _ in client.chat(model="chat", messages=too_long, stream=True):
            pass
    assert caught.value.status_code == 400 and "context" in caught.value.error


def test_litellms_ollama_providers_which_send_no_content_type_get_answers(daemon: Daemon) -> None:
    import litellm  # (conftest keeps its cost map off the internet)

    for provider in ("ollama", "ollama_chat"):  # /api/generate and /api/chat, each body sent without a Content-Type
        answer = litellm.completion(model=f"{provider}/chat", api_base=daemon.url, messages=HI, max_tokens=8,
                                    temperature=0)
        # (what a base model writes after LiteLLM's own "### User:" prompt may be empty: the count says it ran)
        assert 0 < answer.usage.completion_tokens <= 8 and answer.choices[0].finish_reason in ("stop", "length")
    pieces = list(litellm.completion(model="ollama_chat/chat", api_base=daemon.url, messages=HI, max_tokens=8,
                                     temperature=0, stream=True))
    assert pieces[-1].choices[0].finish_reason in ("stop", "length")


def test_ollamas_documented_curl_example_with_a_form_content_type_is_read_as_json(daemon: Daemon) -> None:
    body = json.dumps({"model": "chat", "prompt": "Why is the sky blue?", "stream": False, "options": GREEDY})
    out = subprocess.run(["curl", "-s", "-d", body, f"{daemon.url}/api/generate"], capture_output=True, text=True,
                         timeout=60, check=True)  # curl -d: Content-Type application/x-www-form-urlencoded
    answer = json.loads(out.stdout)
    assert answer["done"] and answer["response"] and answer["eval_count"] <= 8
