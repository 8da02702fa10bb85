"""OpenAI's Predicted Outputs and llamactor's ``speculation`` in the dialects, without a model:
what a body's ``prediction`` (OpenAI) or ``speculation`` (OpenAI, Ollama's options) becomes in the
request's sampling, which ones are refused (by the schema, before anything is queued or
streamed), and the drafted tokens' counts in ``usage`` as the ``openai`` package's own types read
them, whole and streamed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from openai.types import Completion as OACompletion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ValidationError

from llamactor.base.completion import Completion, Usage
from llamactor.base.errors import InvalidRequestError
from llamactor.base.sampling import MAX_PREDICTION_CHARS, SamplingParams
from llamactor.dialects.context import RequestContext
from llamactor.dialects.openai.call import chat_call, completions_call
from llamactor.dialects.openai.events import chat_events
from llamactor.dialects.openai.replies import chat_reply, completion_reply
from llamactor.dialects.ollama import call as ollama_call
from llamactor.dialects.ollama import schema as ollama_schema
from llamactor.dialects.openai.schema import ChatRequest, CompletionRequest

from tests.support.dialects import CTX, collect, completion, updates

pytestmark = pytest.mark.pure

HI = [{"role": "user", "content": "hi"}]
CODE = "def add(a, b):\n    return a + b\n"


def chat(**fields: Any) -> ChatRequest:
    return ChatRequest.model_validate({"messages": HI, **fields})


def drafted(c: Completion, accepted: int, rejected: int) -> Completion:
    return dataclasses.replace(c, usage=dataclasses.replace(c.usage, accepted_prediction_tokens=accepted,
                                                            rejected_prediction_tokens=rejected))


# -- the body's fields in the request's sampling -------------------------------------------------

@pytest.mark.parametrize("content", [CODE, [{"type": "text", "text": "def add(a, b):\n"},
                                            {"type": "text", "text": "    return a + b\n"}]])
def test_a_prediction_given_as_text_or_as_text_parts_is_the_requests_prediction(content: Any) -> None:
    call = chat_call(chat(prediction={"type": "content", "content": content}, n=2, logprobs=True), CTX)
    assert call.request.params.prediction == CODE
    assert call.request.n == 2 and call.request.params.logprobs  # verified drafts change no output: no 400 here


def test_completions_take_the_prediction_for_every_prompt_and_speculation_per_request() -> None:
    body = CompletionRequest.model_validate({"prompt": ["a", "b"], "prediction": {"type": "content", "content": CODE},
                                             "speculation": "ngram"})
    requests = completions_call(body, CTX).requests
    assert [(r.params.prediction, r.params.speculation) for r in requests] == [(CODE, "ngram")] * 2


def test_speculation_left_out_keeps_the_operators_default_and_a_body_overrides_it() -> None:
    ngram_server = RequestContext("t", "m", SamplingParams().replace(speculation="ngram"), created=0)
    assert chat_call(chat(), ngram_server).request.params.speculation == "ngram"
    assert chat_call(chat(speculation="off"), ngram_server).request.params.speculation == "off"
    plain = chat_call(chat(), CTX).request.params
    assert (plain.speculation, plain.prediction) == ("off", None)


@pytest.mark.parametrize("where", ["options", "top level"])
def test_ollama_takes_speculation_among_its_options_and_an_unknown_mode_is_refused(where: str) -> None:
    def body(mode: str) -> ollama_schema.ChatRequest:
        fields = {"options": {"speculation": mode}} if where == "options" else {"speculation": mode}
        return ollama_schema.ChatRequest.model_validate({"model": "m", "messages": HI, **fields})
    call = ollama_call.chat_call(body("ngram"), CTX, 4096)
    assert call is not None and call.request.params.speculation == "ngram"
    assert body("ngram").options.not_applied() == ([], [])  # applied: no warning names it
    with pytest.raises(ValidationError, match="'off' or 'ngram'"):
        body("eagle")


def test_llama_servers_draft_lengths_are_accepted_and_named_as_ignored() -> None:
    body = chat(**{"speculative.n_max": 8, "speculative.n_min": 2, "speculative.p_min": 0.5})
    assert sorted(chat_call(body, CTX).ignored) == ["speculative.n_max", "speculative.n_min", "speculative.p_min"]


# -- malformed predictions: 400s of the body -----------------------------------------------------

@pytest.mark.parametrize("prediction, where, message", [
    (CODE, ("prediction",), "valid dictionary"),  # the text alone, not the object
    ({"type": "file", "content": CODE}, ("prediction", "type"), "'content'"),
    ({"content": CODE}, ("prediction", "type"), "required"),
    ({"type": "content"}, ("prediction", "content"), "required"),
    ({"type": "content", "content": 7}, ("prediction", "content"), "valid string"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
     ("prediction", "content"), "part 0 must be {'type': 'text', 'text': str}"),
    ({"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": 1}]},
     ("prediction", "content"), "part 1 must be"),
    ({"type": "content", "content": ["a"]}, ("prediction", "content"), "part 0 must be"),
    ({"type": "content", "content": CODE, "strict": True}, ("prediction", "strict"), "not permitted"),
])
def test_a_malformed_prediction_is_refused_by_the_schema_naming_where(prediction: Any, where: tuple[str, ...],
                                                                      message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        chat(prediction=prediction, stream=True)
    first = refused.value.errors()[0]
    assert first["loc"][:len(where)] == where and message in first["msg"]


@pytest.mark.parametrize("content, message", [("a\ud800b", "prediction"), ("x" * (MAX_PREDICTION_CHARS + 1), "at most")])
def test_a_prediction_that_is_no_text_or_too_long_is_refused_when_the_request_is_built(content: str,
                                                                                        message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        chat_call(chat(prediction={"type": "content", "content": content}), CTX)


def test_an_unknown_speculation_mode_is_refused() -> None:
    with pytest.raises(ValidationError, match="'off' or 'ngram'"):
        chat(speculation="eagle")


# -- the counts in usage -------------------------------------------------------------------------

def test_usage_sums_the_choices_drafted_tokens_as_openai_reports_them() -> None:
    call = chat_call(chat(n=2, prediction={"type": "content", "content": CODE}), CTX)
    reply = ChatCompletion.model_validate(chat_reply(call, [drafted(completion(CODE), 9, 2),
                                                            drafted(completion(CODE), 7, 4)]))
    details = reply.usage.completion_tokens_details  # type: ignore[union-attr]
    assert details is not None and (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (16, 6)


def test_usage_without_drafts_says_none_were_accepted_or_rejected_on_both_endpoints() -> None:
    chat_body = ChatCompletion.model_validate(chat_reply(chat_call(chat(), CTX), [completion("hello")]))
    legacy = CompletionRequest.model_validate({"prompt": "a"})
    legacy_body = OACompletion.model_validate(completion_reply(completions_call(legacy, CTX), [completion("b")]))
    for usage in (chat_body.usage, legacy_body.usage):
        details = usage.completion_tokens_details  # type: ignore[union-attr]
        assert details is not None and (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (0, 0)


def test_the_streamed_usage_chunk_carries_the_drafted_tokens_counts() -> None:
    call = chat_call(chat(stream=True, stream_options={"include_usage": True},
                          prediction={"type": "content", "content": CODE}), CTX)
    chunks = collect(chat_events(call, updates(["def", " add"], drafted(completion(CODE), 12, 3))))
    last = ChatCompletionChunk.model_validate(chunks[-1])
    assert last.choices == [] and last.usage is not None
    details = last.usage.completion_tokens_details
    assert details is not None and (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (12, 3)
