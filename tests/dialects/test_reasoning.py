"""Reasoning models: a chat template whose answers open with <think> (Qwen3 / DeepSeek-R1 style) gets
its thinking split into reasoning_content, streamed or not, and chat_template_kwargs reach the
template -- on the base Gemma and on SmolLM2-135M-Instruct. Neither thinks on its own, so a grammar
makes it answer in that shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import MODEL_ID, Daemon, start_daemon
from tests.support import TEMPLATES

TEMPLATE = TEMPLATES / "think.jinja"
# the answer a thinking model writes, fixed by a grammar so both decodes are exact: a <think> block,
# then the answer
THINKING = 'root ::= "<think>\\nThe user greets me.\\n</think>\\n\\nHello there"'


@pytest.fixture(scope="module", params=["base", "instruct"])
def daemon(request: pytest.FixtureRequest, instruct_path: str) -> Iterator[Daemon]:
    """The template over the base Gemma, then over SmolLM2-135M-Instruct (whose own ChatML tokens it uses)."""
    model = ("--model", instruct_path) if request.param == "instruct" else ()
    d = start_daemon("--n-parallel", "2", "--chat-template", str(TEMPLATE), *model)
    yield d
    d.stop()


def test_chat_template_kwargs_reach_the_template(daemon: Daemon) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    plain = httpx.post(f"{daemon.url}/apply-template", json={"messages": messages}, timeout=60).json()["prompt"]
    off = httpx.post(f"{daemon.url}/apply-template", json={
        "messages": messages, "chat_template_kwargs": {"enable_thinking": False}}, timeout=60).json()["prompt"]
    assert "<think>" not in plain and off == plain + "<think>\n\n</think>\n\n"


def test_thinking_comes_back_as_reasoning_content_streamed_and_not(daemon: Daemon) -> None:
    client = daemon.client()
    ask = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 40,
           "temperature": 0, "extra_body": {"grammar": THINKING}}
    message = client.chat.completions.create(**ask).choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == ("The user greets me.", "Hello there")
    thought, said = "", ""
    for chunk in client.chat.completions.create(**ask, stream=True):
        if chunk.choices:
            thought += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            said += chunk.choices[0].delta.content or ""
    assert (thought.strip(), said.strip()) == ("The user greets me.", "Hello there")
