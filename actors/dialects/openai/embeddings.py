"""``POST /v1/embeddings``: OpenAI's request body and response, over ``LLM.submit_embed``.

Runs on uvicorn's event loop. Every input of every concurrent request goes into the batcher's
one embedding queue, packed by tokens (``llamactor.scheduling.embedding_queue``).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import llamactor
from llamactor.base.completion import Embeddings
from llamactor.base.messages import MAX_EMBEDDING_INPUTS


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None  # accepted, changes nothing
    # llamactor extras
    pooling: Literal["mean", "cls", "last"] | None = None
    normalize: bool = True

    def inputs(self) -> str | list[Any]:
        if isinstance(self.input, list) and not 1 <= len(self.input) <= MAX_EMBEDDING_INPUTS:
            raise llamactor.InvalidRequestError(f"input must hold 1 to {MAX_EMBEDDING_INPUTS} items")
        return self.input


def _encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, what the openai client decodes
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()  # type: ignore[no-any-return]


async def create_embeddings(llm: llamactor.Client, body: EmbeddingRequest, request_id: str, model_id: str) -> dict[str, Any]:
    future = llm.submit_embed(body.inputs(), request_id=request_id, pooling=body.pooling,  # type: ignore[arg-type]
                              normalize=body.normalize, dimensions=body.dimensions)
    try:
        result = await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        future.cancel()
        raise
    return embeddings_body(result, body, model_id)


def embeddings_body(result: Embeddings, body: EmbeddingRequest, model_id: str) -> dict[str, Any]:
    """The ``/v1/embeddings`` body of a finished request (also a batch line's)."""
    return {"object": "list", "model": model_id,
            "data": [{"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                     for i, v in enumerate(result.vectors)],
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}
