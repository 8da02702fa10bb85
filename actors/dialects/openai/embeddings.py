"""``POST /v1/embeddings``: OpenAI's request body, the ``EmbeddingRequest`` it makes, and its
response body, float or base64 (pure). Every input of every concurrent request goes into the
batcher's one embedding queue, packed by tokens (``llamactor.scheduling.embedding_queue``).
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from llamactor.base.completion import Embeddings
from llamactor.base.errors import InvalidRequestError
from llamactor.base.messages import MAX_EMBEDDING_INPUTS
from llamactor.base.embedding_request import EmbeddingRequest
from llamactor.dialects.context import RequestContext


class EmbeddingsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None  # accepted, changes nothing
    # llamactor extras
    pooling: Literal["mean", "cls", "last"] | None = None
    normalize: bool = True


def embeddings_request(body: EmbeddingsBody, ctx: RequestContext) -> EmbeddingRequest:
    if isinstance(body.input, list) and not 1 <= len(body.input) <= MAX_EMBEDDING_INPUTS:
        raise InvalidRequestError(f"input must hold 1 to {MAX_EMBEDDING_INPUTS} items")
    return EmbeddingRequest.build(body.input, pooling=body.pooling, normalize=body.normalize,
                                  dimensions=body.dimensions, request_id=ctx.id("embd-"))


def _encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, what the openai client decodes
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()  # type: ignore[no-any-return]


def embeddings_reply(result: Embeddings, body: EmbeddingsBody, ctx: RequestContext) -> dict[str, Any]:
    """The ``/v1/embeddings`` body of a finished request (also a batch line's)."""
    return {"object": "list", "model": ctx.model,
            "data": [{"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                     for i, v in enumerate(result.vectors)],
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}
