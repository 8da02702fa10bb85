"""The OpenAI dialect: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``,
``/v1/models`` and ``/v1/models/{id}``, each also without the ``/v1`` prefix (llama-server's
routes: an openai client whose ``base_url`` lacks ``/v1`` calls those).

Handlers run on uvicorn's event loop; the request path is ``llamactor.http.request_path``.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import FastAPI, Request

from llamactor.base.errors import ModelNotFoundError
from llamactor.http.embeddings import EmbeddingRequest, create_embeddings
from llamactor.http.openai_bodies import chat_body, completion_body, envelope, prompt_id
from llamactor.http.openai_schema import ChatRequest, CompletionRequest
from llamactor.http.request_path import all_queued, complete, ready_model
from llamactor.http.sse import chat_chunks, completion_chunks, sse_response
from llamactor.http.state import ServerState

DIALECT = "openai"


def both(path: str) -> list[str]:
    """``/v1/x`` and llama-server's ``/x``."""
    return [path, path.removeprefix("/v1")]


def register(app: FastAPI, state: ServerState) -> None:
    def model_entry(name: str) -> dict[str, Any]:
        router = state.router
        return {"id": name, "object": "model", "created": 0, "owned_by": "llamactor",
                "loaded": bool(router is not None and router.model(name).loaded)}

    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_entry(name) for name in state.model_names]}

    async def model(model_id: str) -> dict[str, Any]:
        if model_id not in state.model_names:
            raise ModelNotFoundError.among(model_id, state.model_names)
        return model_entry(model_id)

    async def completions(body: CompletionRequest, request: Request) -> Any:
        llm = await ready_model(state, body.model)
        body.check()
        rid = f"cmpl-{request.state.request_id}"
        observe = state.metrics.observer(llm.name, DIALECT)
        # A batch of prompts: choice index = prompt_index * n + choice, as OpenAI numbers them; the
        # n choices of each prompt go out together (one replica, the prompt computed once).
        prompts, n, n_gen = body.prompts(), body.n, body.n_generated
        sampling = body.sampling()
        if body.stream:
            streams = await all_queued([functools.partial(llm.stream_n_async, prompt, n, **sampling,
                                                          request_id=prompt_id(rid, p, len(prompts)))
                                        for p, prompt in enumerate(prompts)])
            echoed = [str(prompts[k // n]) for k in range(len(streams))] if body.echo else None
            return sse_response(completion_chunks(streams, lambda: envelope(rid, "text_completion", llm.name),
                                                  observe, body.logprobs, echoed))
        generated = await complete(request, observe, lambda: [
            f for p, prompt in enumerate(prompts)
            for f in llm.submit_n(prompt, n_gen, request_id=prompt_id(rid, p, len(prompts)), **sampling)])
        if body.echo and not body.scores_prompt:  # token-id prompts echo as text
            prompts = [p if isinstance(p, str) else (await llm.tokenize_async(p)).text for p in prompts]
        return completion_body(rid, llm.name, body, prompts, generated)

    async def chat_completions(body: ChatRequest, request: Request) -> Any:
        llm = await ready_model(state, body.model)
        body.check()
        rid = f"chatcmpl-{request.state.request_id}"
        observe = state.metrics.observer(llm.name, DIALECT)
        messages = body.message_dicts()
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            streams = await all_queued([functools.partial(llm.stream_chat_n_async, messages, body.n,
                                                          request_id=rid, **body.sampling())])
            return sse_response(chat_chunks(streams, lambda: envelope(rid, "chat.completion.chunk", llm.name),
                                            observe, include_usage, body.logprobs, body.parsed_tools))
        done = await complete(request, observe, lambda: llm.submit_chat_n(messages, body.n, request_id=rid,
                                                                         **body.sampling()))
        return chat_body(rid, llm.name, done)

    async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
        llm = await ready_model(state, body.model)
        return await create_embeddings(llm, body, f"embd-{request.state.request_id}", llm.name)

    for path in both("/v1/models"):
        app.get(path)(models)
    for path in both("/v1/models/{model_id:path}"):
        app.get(path)(model)
    for path in both("/v1/completions"):
        app.post(path, response_model=None)(completions)
    for path in both("/v1/chat/completions"):
        app.post(path, response_model=None)(chat_completions)
    for path in both("/v1/embeddings"):
        app.post(path, response_model=None)(embeddings)
