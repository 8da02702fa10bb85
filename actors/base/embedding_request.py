"""``EmbeddingRequest``: the typed embedding request every front end builds (the Python API's
``embed``, ``/v1/embeddings``, Ollama's ``/api/embed``, a batch line), its inputs shaped and checked
once, on the caller's thread, before anything is queued. Pure: no actor, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.base.messages import MAX_EMBEDDING_INPUTS, POOLINGS
from llamactor.base.request_checks import check_text
from llamactor.base.tenants import DEFAULT, Tenant

EmbedInputs = str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """Inputs to embed (texts or token-id lists), how to pool and shape their vectors."""

    inputs: tuple[str | tuple[int, ...], ...]
    pooling: str | None = None  # "mean" | "cls" | "last"; None: the GGUF's, else mean
    normalize: bool = True  # L2
    dimensions: int | None = None  # keep the first components, then renormalize
    truncate: bool = False  # an input longer than one embedding step is cut (Ollama) instead of refused
    request_id: str | None = None
    tenant: Tenant = DEFAULT

    def __post_init__(self) -> None:
        if not 1 <= len(self.inputs) <= MAX_EMBEDDING_INPUTS:
            raise InvalidRequestError(f"embed takes 1 to {MAX_EMBEDDING_INPUTS} inputs, got {len(self.inputs)}")
        if not all(isinstance(x, str) or (isinstance(x, tuple) and all(isinstance(t, int) for t in x))
                   for x in self.inputs):
            raise InvalidRequestError("each input must be a string or a list of token ids")
        check_text(self.inputs if len(self.inputs) > 1 else self.inputs[0], "input")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise InvalidRequestError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.dimensions is not None and (not isinstance(self.dimensions, int) or self.dimensions < 1):
            raise InvalidRequestError(f"dimensions must be a positive integer, got {self.dimensions!r}")

    @classmethod
    def build(cls, inputs: EmbedInputs, **options: Any) -> EmbeddingRequest:
        """``inputs``: a string, a list of strings, a list of token ids, or a list of such lists."""
        return cls(embed_inputs(inputs), **options)


def embed_inputs(inputs: EmbedInputs) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(inputs, str):
        return (inputs,)
    if isinstance(inputs, Sequence) and inputs and all(isinstance(t, int) for t in inputs):
        return (tuple(inputs),)  # type: ignore[arg-type]
    if not isinstance(inputs, Sequence) or not inputs:
        raise InvalidRequestError("embed takes a string, a list of strings, token ids, or lists of token ids")
    # anything else (a number, a dict) is refused by EmbeddingRequest with a clear message
    return tuple(x if isinstance(x, str) else tuple(x) if isinstance(x, Sequence) else x  # type: ignore[misc, arg-type]
                 for x in inputs)
