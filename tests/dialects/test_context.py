"""``RequestContext``: what a body that sets no limit on new tokens gets, in every dialect."""

from __future__ import annotations

from typing import Any

import pytest

from llamactor.base.config import Config
from llamactor.dialects.context import RequestContext
from llamactor.dialects.ollama import call as ollama
from llamactor.dialects.ollama.schema import ChatRequest as OllamaChat, GenerateRequest
from llamactor.dialects.openai.call import chat_call, completions_call
from llamactor.dialects.openai.schema import ChatRequest, CompletionRequest
from llamactor.dialects.responses.call import response_call
from llamactor.dialects.responses.schema import ResponsesRequest

pytestmark = pytest.mark.pure
HI = [{"role": "user", "content": "hi"}]


def limits(ctx: RequestContext, **asked: Any) -> list[int | None]:
    """The max_tokens each dialect's request gets from a body with ``asked`` (or no limit)."""
    calls = [
        chat_call(ChatRequest.model_validate({"messages": HI, **asked.get("openai", {})}), ctx).request,
        completions_call(CompletionRequest.model_validate({"prompt": "hi", **asked.get("openai", {})}), ctx).requests[0],
        response_call(ResponsesRequest.model_validate({"input": "hi", **asked.get("responses", {})}), ctx).request,
        ollama.chat_call(OllamaChat.model_validate({"model": "m", "messages": HI, **asked.get("ollama", {})}),
                         ctx, 1024),
        ollama.generate_call(GenerateRequest.model_validate({"model": "m", "prompt": "hi", **asked.get("ollama", {})}),
                             ctx, 1024),
    ]
    return [getattr(c, "request", c).params.max_tokens for c in calls]


def test_a_body_without_a_limit_runs_to_the_end_unless_the_operator_set_one() -> None:
    assert limits(RequestContext("r", "m", Config().sampling)) == [None] * 5
    operator = Config.from_kwargs(max_tokens=12).sampling
    assert limits(RequestContext("r", "m", operator)) == [12] * 5  # before: None, --max-tokens ignored
    asked = {"openai": {"max_tokens": 5}, "responses": {"max_output_tokens": 5}, "ollama": {"options": {"num_predict": 5}}}
    assert limits(RequestContext("r", "m", operator), **asked) == [5] * 5
    unlimited = {"ollama": {"options": {"num_predict": -1}}}
    assert limits(RequestContext("r", "m", operator), **unlimited)[3:] == [None, None]
