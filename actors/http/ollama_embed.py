"""Embeddings for ``/api/embed`` and ``/api/embeddings`` (uvicorn's event loop).

Ollama truncates an input longer than the model takes unless ``truncate`` is false; llamactor
refuses an embedding input longer than one embedding step (``Config.embedding_n_batch`` tokens).
So an input that may be too long (more UTF-8 bytes than that, less a margin for BOS/EOS: a token
covers at least one byte) is tokenized first and cut, and the inputs go as token ids. Short inputs,
nearly all of them, go as text with no extra round trip.
"""

from __future__ import annotations

import asyncio

from fastapi import Request

from llamactor.base.completion import Embeddings
from llamactor.handles.model import ModelClient
from llamactor.http.request_path import gather

SPECIAL_MARGIN = 4  # BOS, EOS/SEP and a space prefix a tokenizer may add


async def embed_inputs(request: Request, llm: ModelClient, texts: list[str], truncate: bool, normalize: bool,
                       dimensions: int | None) -> Embeddings:
    """``texts``' vectors (L2-normalized when ``normalize``, cut to ``dimensions`` first);
    cancelled if the client disconnects."""
    limit = llm.config.embedding_n_batch
    inputs: list[str] | list[list[int]] = texts
    if truncate and any(len(t.encode()) + SPECIAL_MARGIN > limit for t in texts):
        tokenized = await asyncio.gather(*(llm.tokenize_async(t) for t in texts))
        inputs = [list(t.token_ids[:limit]) for t in tokenized]
    future = llm.submit_embed(inputs, request_id=f"ollama-embd-{request.state.request_id}", normalize=normalize,
                              dimensions=dimensions)
    (result,) = await gather(request, [future])
    return result  # type: ignore[no-any-return]
