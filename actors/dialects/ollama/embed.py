"""``/api/embed`` and the legacy ``/api/embeddings`` (pure): the ``EmbeddingRequest`` a body makes
and the body of its result.

Ollama truncates an input longer than the model takes unless ``truncate`` is false: the engine
cuts it to one embedding step (``EmbeddingRequest.truncate``), in the same trip. The legacy route
embeds one prompt, not normalized, always truncated. An empty input gives no vectors (having
loaded the model): there is then no request to make.
"""

from __future__ import annotations

from typing import Any

from llamactor.base.completion import Embeddings
from llamactor.base.embedding_request import EmbeddingRequest
from llamactor.dialects.context import RequestContext
from llamactor.dialects.ollama.schema import EmbeddingsRequest, EmbedRequest


def embed_request(body: EmbedRequest, ctx: RequestContext) -> EmbeddingRequest | None:
    texts = ([body.input] if body.input else []) if isinstance(body.input, str) else body.input
    if not texts:
        return None
    return EmbeddingRequest(tuple(texts), truncate=body.truncate is not False, dimensions=body.dimensions,
                            request_id=ctx.id("ollama-embd-"))


def embed_reply(body: EmbedRequest, result: Embeddings | None, load_ns: int) -> dict[str, Any]:
    if result is None:
        return {"model": body.model, "embeddings": [], "load_duration": load_ns}
    return {"model": body.model, "embeddings": result.vectors.tolist(),
            "total_duration": int(result.total_ms * 1e6) + load_ns, "load_duration": load_ns,
            "prompt_eval_count": result.prompt_tokens}


def embeddings_request(body: EmbeddingsRequest, ctx: RequestContext) -> EmbeddingRequest | None:
    if not body.prompt:
        return None
    return EmbeddingRequest((body.prompt,), normalize=False, truncate=True, request_id=ctx.id("ollama-embd-"))


def embeddings_reply(result: Embeddings | None) -> dict[str, Any]:
    return {"embedding": result.vectors[0].tolist() if result is not None else []}
