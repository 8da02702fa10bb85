"""Label requests (``GenerationRequest.label_token_ids``, rerank's yes/no groups) checked on the
caller's thread: their groups, max_tokens 0, and continuations without prompt_logprobs
(the ids against the vocabulary: tests/tree/test_label_scoring.py)."""

from __future__ import annotations

import numpy as np
import pytest

from llamactor.base.errors import InvalidRequestError
from llamactor.base.request import GenerationRequest
from llamactor.base.request_checks import MAX_LABEL_IDS
from llamactor.base.sampling import SamplingParams

pytestmark = pytest.mark.pure

DEFAULTS = SamplingParams()


def build(**options: object) -> GenerationRequest:
    return GenerationRequest.build(DEFAULTS, **{"prompt": "Query: q\nDocument:", **options})  # type: ignore[arg-type]


def test_a_label_request_samples_nothing_and_carries_its_groups_to_every_choice() -> None:
    request = build(n=3, continuations=[" a", " b", [5, 6]], label_token_ids=[[7, 8, 7], (9,)])
    assert request.params.max_tokens == 0 and request.params.prompt_logprobs is None
    assert request.label_token_ids == ((7, 8), (9,))  # a repeat counts once
    messages = request.generate_messages("r", [object()] * 3, 0.0)  # type: ignore[list-item]
    assert [m.label_token_ids for m in messages] == [((7, 8), (9,))] * 3
    assert [m.continuation for m in messages] == [" a", " b", (5, 6)]
    assert all(m.params.max_tokens == 0 for m in messages)


def test_continuations_still_need_prompt_logprobs_or_labels() -> None:
    with pytest.raises(InvalidRequestError, match="prompt_logprobs or label_token_ids"):
        build(n=2, continuations=[" a", " b"], max_tokens=0)


@pytest.mark.parametrize("groups, says", [
    ([[1, 2]], "at least two groups"),
    ([], "at least two groups"),  # an empty list is no label request: refused by the continuations check
    ([[1], []], r"label_token_ids\[1\] must be a non-empty list"),
    ([[1], [-3]], r"label_token_ids\[1\] holds -3"),
    ([[1], [True]], r"label_token_ids\[1\] holds True"),
    ([[1], ["yes"]], r"label_token_ids\[1\] holds 'yes'"),
    ([[1], "no"], r"label_token_ids\[1\] must be a non-empty list"),
    ("yes", "at least two groups"),
    ([[1, 2], [2]], r"token id 2 is in label_token_ids\[0\] and label_token_ids\[1\]"),
    ([list(range(MAX_LABEL_IDS)), [MAX_LABEL_IDS]], f"more than {MAX_LABEL_IDS} token ids"),
])
def test_bad_groups_are_refused_naming_the_parameter(groups: object, says: str) -> None:
    if groups == []:
        with pytest.raises(InvalidRequestError, match="prompt_logprobs or label_token_ids"):
            build(n=2, continuations=[" a", " b"], label_token_ids=groups)
        return
    with pytest.raises(InvalidRequestError, match=says) as caught:
        build(label_token_ids=groups)
    assert caught.value.details["param"] == "label_token_ids"


@pytest.mark.parametrize("value", [7, {"yes": [1]}, np.array([[1], [2]])])
def test_groups_of_another_type_are_refused_as_such(value: object) -> None:
    with pytest.raises(InvalidRequestError, match="at least two groups") as caught:
        build(label_token_ids=value)
    assert caught.value.details["param"] == "label_token_ids"


@pytest.mark.parametrize("value", [None, (), []])
def test_no_groups_is_no_label_request(value: object) -> None:
    request = build(label_token_ids=value, max_tokens=3)
    assert request.label_token_ids == () and request.params.max_tokens == 3


def test_a_label_request_asking_for_tokens_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens must be 0") as caught:
        build(label_token_ids=[[1], [2]], max_tokens=5)
    assert caught.value.details["param"] == "max_tokens"


def test_the_constructor_checks_and_normalizes_the_groups_too() -> None:
    request = GenerationRequest(params=SamplingParams(max_tokens=0), text="x",
                                label_token_ids=[[3, 3], [4]])  # type: ignore[arg-type]
    assert request.label_token_ids == ((3,), (4,))
    with pytest.raises(InvalidRequestError, match="max_tokens must be 0"):
        GenerationRequest(params=SamplingParams(), text="x", label_token_ids=((3,), (4,)))
