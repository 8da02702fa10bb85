"""What the fuzz (tests/test_fuzz_routes.py, tests/test_fuzz_request.py) found, each pinned by the
smallest case that showed it, so that it stays fixed whatever the fuzz's seed or budget."""

from __future__ import annotations

import pytest

from llamactor.base.adapters import adapter_set
from llamactor.base.config import SamplingParams
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
    assert adapter_set([("style", 0.5)], ["style"]) == (("style", 0.5),)
    assert adapter_set((("style", 2),), None) == (("style", 2.0),)
