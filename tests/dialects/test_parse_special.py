"""``parse_special``, model-free: where each front end takes it (a completions body, a batch line,
Ollama's options or its top level, the typed request), that it defaults to on, that a value
other than a bool is refused before anything is queued (how control-token text is found in a
chat message's content: tests/base/test_text_finder.py)."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import InvalidRequestError
from llamactor.base.messages import ReplyChannel
from llamactor.base.request import GenerationRequest
from llamactor.dialects.ollama.call import generate_call
from llamactor.dialects.ollama.schema import GenerateRequest
from llamactor.dialects.openai.call import completions_call
from llamactor.dialects.openai.schema import ChatRequest, CompletionRequest
from llamactor.jobs.endpoints import check_body

from tests.support.dialects import CTX

pytestmark = pytest.mark.pure

CHATML = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def completions(**fields: Any) -> list[GenerationRequest]:
    return completions_call(CompletionRequest.model_validate({"prompt": CHATML, **fields}), CTX).requests


def ollama_generate(**fields: Any) -> GenerationRequest:
    call = generate_call(GenerateRequest.model_validate({"model": "m", "prompt": CHATML, **fields}), CTX, 2048)
    assert call is not None
    return call.request


def test_a_completions_body_parses_special_text_unless_it_says_false_for_every_prompt() -> None:
    assert [r.parse_special for r in completions()] == [True]
    assert [r.parse_special for r in completions(prompt=[CHATML, "b"], parse_special=False)] == [False, False]
    for bad in ("false", 0, None, "no"):
        with pytest.raises(pydantic.ValidationError, match="parse_special"):
            CompletionRequest.model_validate({"prompt": CHATML, "parse_special": bad})


def test_a_chat_body_has_no_parse_special_its_content_is_never_parsed() -> None:
    with pytest.raises(pydantic.ValidationError, match="parse_special"):
        ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "parse_special": False})


def test_a_batch_line_takes_parse_special_as_its_endpoint_does() -> None:
    line = {"model": "m", "prompt": CHATML, "max_tokens": 2}
    assert check_body("/v1/completions", {**line, "parse_special": False}) is None
    refused = check_body("/v1/completions", {**line, "parse_special": "off"})
    assert refused is not None and refused.startswith("parse_special:")


def test_ollama_takes_parse_special_in_options_or_at_the_top_level_for_raw_prompts() -> None:
    assert ollama_generate(raw=True).parse_special is True
    assert ollama_generate(raw=True, options={"parse_special": False}).parse_special is False
    assert ollama_generate(raw=True, parse_special=False).parse_special is False  # moved into options
    assert ollama_generate(raw=True, parse_special=True, options={"parse_special": False}).parse_special is False
    templated = ollama_generate(options={"parse_special": True})
    assert templated.messages is not None and templated.text is None  # the prompt is a message's content
    with pytest.raises(pydantic.ValidationError, match="parse_special"):
        ollama_generate(raw=True, options={"parse_special": "yes"})
    no_warning = GenerateRequest.model_validate({"model": "m", "options": {"parse_special": False}})
    assert no_warning.options.not_applied() == ([], [])


def test_the_typed_request_checks_parse_special_and_hands_it_to_every_choice() -> None:
    for bad in ("false", 0, 1, None):
        with pytest.raises(InvalidRequestError, match="parse_special"):
            GenerationRequest.build(SamplingParams(), prompt=CHATML, parse_special=bad)
    request = GenerationRequest.build(SamplingParams(), prompt=CHATML, n=3, parse_special=False)
    messages = request.generate_messages("r", [ReplyChannel() for _ in range(3)], 0.0)
    assert [m.parse_special for m in messages] == [False] * 3
    assert GenerationRequest.build(SamplingParams(), prompt=CHATML).generate_messages(
        "r", [ReplyChannel()], 0.0)[0].parse_special is True
