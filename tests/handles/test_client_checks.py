"""The in-process API refuses at the edge what the HTTP routes refuse: ``Client.tokenize`` checks
its text and messages on the caller's thread (a lone surrogate, a malformed earlier tool call are
the caller's ``InvalidRequestError``), so nothing of it reaches the batcher."""

from __future__ import annotations

import pytest

import llamactor
from llamactor.base.errors import InvalidRequestError


@pytest.mark.parametrize("prompt", [
    "a lone \ud800 surrogate",
    ["text part", "\udfff", 2],
    [{"role": "user", "content": "hi \ud83d"}],
    [{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function"}]}],
], ids=["text", "parts", "messages", "tool_calls_without_function"])
def test_tokenize_refuses_what_no_route_lets_through_before_it_is_sent(llm: llamactor.LLM, prompt) -> None:
    restarts = llm.stats()["restarts"]
    with pytest.raises(InvalidRequestError):
        llm.tokenize(prompt)
    assert llm.tokenize("still serving").token_ids and llm.stats()["restarts"] == restarts
