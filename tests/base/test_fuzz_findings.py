"""What the fuzz (tests/http/test_fuzz_routes.py, tests/base/test_request_fuzz.py) found, each pinned by the
smallest case that showed it, so that it stays fixed whatever the fuzz's seed or budget."""

from __future__ import annotations

from typing import Any

import pytest

import llamactor
from llamactor.base.adapters import adapter_set
from llamactor.base.chat_template import ChatTemplate, ChatTemplateError
from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import InvalidRequestError
from llamactor.base.request import GenerationRequest


@pytest.mark.pure
@pytest.mark.parametrize("lora", [400, "style", [["style", 1.0, 2]], [("style",)], [None], 1.5])
def test_a_lora_that_is_not_names_to_scales_is_an_invalid_request(lora: object) -> None:
    """``lora=400`` raised TypeError and ``lora=[[name, scale, extra]]`` ValueError from unpacking in
    ``adapter_set``: a caller's mistake must be the typed 400, like every other bad argument."""
    with pytest.raises(InvalidRequestError, match="lora must map adapter names to scales"):
        adapter_set(lora, ["style"])  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="lora"):
        GenerationRequest.build(SamplingParams(), prompt="hi", lora=lora)  # type: ignore[arg-type]


@pytest.mark.pure
def test_a_lora_as_names_to_scales_or_pairs_still_builds() -> None:
    assert adapter_set({"style": 0.5}, ["style"]) == (("style", 0.5),)
    assert adapter_set([("style", 0.5)], ["style"]) == (("style", 0.5),)  # type: ignore[arg-type]
    assert adapter_set((("style", 2),), None) == (("style", 2.0),)


ODD_ROLES = [{"role": {"name": "user"}, "content": "hi"}, {"role": ["user"], "content": "hi"}]


@pytest.mark.pure
@pytest.mark.parametrize("messages", [ODD_ROLES[:1], ODD_ROLES[1:], [None, None], ["hi", {"role": "user", "content": "hi"}]])
def test_messages_with_an_unhashable_role_or_that_are_not_mappings_are_a_template_error(messages: list[Any]) -> None:
    """A role that is a dict or a list raised TypeError ("unhashable type") from the role check
    itself, and two trailing non-mappings AttributeError from the trailing-assistants rule."""
    with pytest.raises(ChatTemplateError, match="needs a role"):
        ChatTemplate(None, bos_token="", eos_token="").render(messages)


def test_an_unhashable_role_fails_its_request_and_the_batcher_goes_on(start_llm: Any) -> None:
    """The fuzz's first crash of the batcher: it rendered the chat on its thread, the TypeError
    killed it, and the supervisor replayed the request into the same death until it gave up."""
    llm = start_llm(n_ctx=1024, n_parallel=2, max_restarts=1)
    for message in ODD_ROLES:
        with pytest.raises(llamactor.InvalidRequestError, match="needs a role"):
            llm.chat([message], max_tokens=2)
    assert llm.chat([{"role": "user", "content": "hi"}], max_tokens=2, temperature=0).finish_reason in ("stop", "length")
    assert llm.stats()["restarts"] == 0


@pytest.mark.pure
@pytest.mark.parametrize("sampling", [
    {"temperature": "hot"}, {"top_p": {}}, {"min_p": "0.1"}, {"repeat_penalty": [1]}, {"presence_penalty": []},
    {"frequency_penalty": "0"}, {"repeat_last_n": [""]}, {"stop": 5}, {"stop": ["ok", 7]},
    {"echo": True, "top_logprobs": "x"}, {"echo": True, "logprobs": 2, "top_logprobs": "2"},
])
def test_sampling_values_of_the_wrong_type_are_invalid_requests(sampling: dict[str, Any]) -> None:
    """``SamplingParams`` compared values before checking their types (``temperature=None``:
    TypeError), and ``echo`` took the max of whatever ``top_logprobs`` was."""
    with pytest.raises(InvalidRequestError):
        GenerationRequest.build(SamplingParams(), prompt="hi", **sampling)


@pytest.mark.pure
def test_a_sampling_value_of_none_keeps_the_configured_one() -> None:
    configured = SamplingParams(temperature=0.3, top_p=0.5, stop=("END",))
    unset = ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "stop")
    request = GenerationRequest.build(configured, prompt="hi", **dict.fromkeys(unset))
    assert request.params.temperature == 0.3 and request.params.top_p == 0.5 and request.params.stop == ("END",)


@pytest.mark.pure
@pytest.mark.parametrize("messages", [[None], ["hi"], [{"role": "user", "content": "hi"}, 3]])
def test_messages_that_are_not_mappings_are_invalid_requests_on_the_callers_side(messages: list[Any]) -> None:
    """Non-mapping messages were kept, and failed as AttributeError in the rate limiter's estimate
    (caller's thread) or while rendering (the batcher's)."""
    with pytest.raises(InvalidRequestError, match=r"messages\[\d\] must be"):
        GenerationRequest.build(SamplingParams(), messages=messages)
