"""SmolLM2-135M-Instruct, the model ``make chat`` opens: it answers a plain question at the default
sampling (the README's promise), and the daemon's OpenAI chat route, ``/apply-template`` and
``/tokenize`` go through its GGUF's own ChatML template."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.support.daemon import (
    API_KEY,
    Daemon,
    assert_same_greedy_text_up_to_near_tie,
    chat_result,
    start_daemon,
    streamed_chat_result,
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}}}


def test_the_instruct_model_names_paris_in_nine_of_ten_sessions_at_the_default_sampling(start_llm,
                                                                                         instruct_path: str) -> None:
    llm = start_llm(model=instruct_path, n_parallel=4)
    assert llm.info.chat_template == "gguf" and not llm.info.looks_like_base_model
    # ten fresh sessions: llamactor's default sampling (temperature 0.8, top-k 40, top-p 0.95,
    # min-p 0.05; the REPL's own is cooler), seeded so that a failure can be replayed
    requests = [llm.request(messages=QUESTION, seed=1000 + i, max_tokens=48) for i in range(10)]
    answers = [f.result() for f in [llm.submit(r)[0] for r in requests]]
    assert sum("paris" in c.text.lower() for c in answers) >= 9, [c.text for c in answers]


@pytest.fixture(scope="module")
def daemon(instruct_path: str) -> Iterator[Daemon]:
    d = start_daemon("--model", instruct_path, "--n-parallel", "4", "--api-key", API_KEY)
    yield d
    assert d.stop() == 0


def test_chat_through_the_ggufs_template_is_the_same_streamed_and_not(daemon: Daemon) -> None:
    client = daemon.client()
    ask = {"model": "m", "messages": QUESTION, "max_tokens": 16, "temperature": 0, "logprobs": True,
           "top_logprobs": 2}
    whole = client.chat.completions.create(**ask)
    assert "Paris" in (whole.choices[0].message.content or "") and whole.choices[0].finish_reason == "stop"
    streamed = streamed_chat_result(client.chat.completions.create(**ask, stream=True))
    assert_same_greedy_text_up_to_near_tie(streamed, chat_result(whole.choices[0]))


def test_apply_template_and_tokenize_render_the_chatml_turns_and_its_default_system_message(daemon: Daemon) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    rendered = httpx.post(f"{daemon.url}/apply-template", json={"messages": QUESTION}, headers=headers,
                          timeout=60).json()["prompt"]
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    with_tools = httpx.post(f"{daemon.url}/apply-template", json={"messages": QUESTION, "tools": [WEATHER]},
                            headers=headers, timeout=60).json()["prompt"]
    # the template knows no tools: the plain-text instructions are the system message it renders
    assert with_tools.startswith("<|im_start|>system\nYou can call the following tools") and "SmolLM" not in with_tools
    tokens = httpx.post(f"{daemon.url}/tokenize", json={"content": "<|im_start|>user", "with_pieces": True},
                        headers=headers, timeout=60).json()["tokens"]
    assert tokens[0]["piece"] == "<|im_start|>"  # a special token of its own vocabulary


def test_a_required_tool_call_comes_back_through_the_openai_client(daemon: Daemon) -> None:
    client = daemon.client()
    c = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                       tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=64)
    [call] = c.choices[0].message.tool_calls or []
    assert c.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
