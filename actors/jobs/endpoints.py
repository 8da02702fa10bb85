"""One batch line as the request its endpoint would make, and the response body its HTTP call
would answer: the OpenAI dialect's own request schemas (``llamactor.http.openai_schema``,
``llamactor.http.embeddings``, ``llamactor.http.responses_schema``) and response types, so a
line's output is what ``POST /v1/chat/completions`` (``/v1/completions``, ``/v1/embeddings``,
``/v1/responses``) gives for that body.

A job's requests go in at ``low`` priority (a body's ``priority`` is overridden): interactive
callers come first, aging still lets the job through under constant load. Runs on the runner's
thread; only builds messages and reads finished completions.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from llamactor.base.completion import Completion, Embeddings
from llamactor.base.errors import InvalidRequestError
from llamactor.handles.client import Client
from llamactor.http.embeddings import EmbeddingRequest, embeddings_body
from llamactor.http.openai_bodies import chat_body, completion_body, prompt_id
from llamactor.http.openai_schema import ChatRequest, CompletionRequest
from llamactor.http.responses_output import Shell, output_items, status_of
from llamactor.http.responses_output import usage as response_usage
from llamactor.http.responses_schema import ResponsesRequest, plan

JOB_PRIORITY = "low"
SCHEMAS: dict[str, type[BaseModel]] = {"/v1/chat/completions": ChatRequest, "/v1/completions": CompletionRequest,
                                       "/v1/embeddings": EmbeddingRequest, "/v1/responses": ResponsesRequest}


def check_body(endpoint: str, body: dict[str, Any]) -> str | None:
    """What the endpoint would refuse in ``body`` (its 400's message), or None: the schema
    (unknown fields included), then the checks a handler makes before queueing (grammars, tools)."""
    try:
        request = SCHEMAS[endpoint].model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = str(first.get("msg", "invalid body")).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    try:
        if isinstance(request, (ChatRequest, CompletionRequest)):
            request.check()
        elif isinstance(request, EmbeddingRequest):
            request.inputs()
        elif isinstance(request, ResponsesRequest):
            _responses_plan(request)
    except InvalidRequestError as e:
        return str(e)
    return None


@dataclass(slots=True)
class PendingLine:
    """A line's requests in flight: its futures, and how their results become the response body."""

    request_id: str
    futures: list[concurrent.futures.Future[Any]]
    respond: Callable[[list[Any]], dict[str, Any]]

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def response_body(self) -> dict[str, Any]:
        """The body (raises the first failure: the line failed)."""
        return self.respond([f.result() for f in self.futures])

    def cancel(self) -> None:
        for f in self.futures:
            f.cancel()


def start_line(client: Client, endpoint: str, body: dict[str, Any], request_id: str, model_name: str) -> PendingLine:
    """Queue the line's requests on ``client``; ``InvalidRequestError`` (and the other typed
    errors of ``submit``) if they are refused before queueing."""
    if endpoint == "/v1/chat/completions":
        return _chat(client, ChatRequest.model_validate(body), request_id, model_name)
    if endpoint == "/v1/completions":
        return _completions(client, CompletionRequest.model_validate(body), request_id, model_name)
    if endpoint == "/v1/embeddings":
        return _embeddings(client, EmbeddingRequest.model_validate(body), request_id, model_name)
    if endpoint == "/v1/responses":
        return _responses(client, ResponsesRequest.model_validate(body), request_id, model_name)
    raise InvalidRequestError(f"unsupported batch endpoint {endpoint}")


def _chat(client: Client, req: ChatRequest, request_id: str, model: str) -> PendingLine:
    req.check()
    rid = f"chatcmpl-{request_id}"
    futures = client.submit_chat_n(req.message_dicts(), req.n, request_id=request_id,
                                   **{**req.sampling(), "priority": JOB_PRIORITY})

    def respond(done: list[Completion]) -> dict[str, Any]:
        return chat_body(rid, model, done)
    return PendingLine(request_id, list(futures), respond)


def _completions(client: Client, req: CompletionRequest, request_id: str, model: str) -> PendingLine:
    req.check()
    rid = f"cmpl-{request_id}"
    prompts, n_gen = req.prompts(), req.n_generated
    sampling = {**req.sampling(), "priority": JOB_PRIORITY}
    futures = [f for p, prompt in enumerate(prompts)
               for f in client.submit_n(prompt, n_gen, request_id=prompt_id(request_id, p, len(prompts)), **sampling)]

    def respond(generated: list[Completion]) -> dict[str, Any]:
        echoed: list[str | list[int]] = prompts
        if req.echo and not req.scores_prompt:  # token-id prompts echo as text, as the endpoint's do
            echoed = [p if isinstance(p, str) else client.tokenize(p).text for p in prompts]
        return completion_body(rid, model, req, echoed, generated)
    return PendingLine(request_id, futures, respond)


def _embeddings(client: Client, req: EmbeddingRequest, request_id: str, model: str) -> PendingLine:
    # Embedding steps have their own queue and time share (embedding_time_share): no priority.
    future = client.submit_embed(req.inputs(), request_id=request_id, pooling=req.pooling,  # type: ignore[arg-type]
                                 normalize=req.normalize, dimensions=req.dimensions)

    def respond(done: list[Embeddings]) -> dict[str, Any]:
        return embeddings_body(done[0], req, model)
    return PendingLine(request_id, [future], respond)


def _responses_plan(req: ResponsesRequest) -> Any:
    # A batch line stands alone: the daemon's in-memory store of earlier responses is no journal.
    if req.previous_response_id is not None:
        raise InvalidRequestError("previous_response_id is not supported in a batch: send the conversation as input")
    return plan(req)


def _responses(client: Client, req: ResponsesRequest, request_id: str, model: str) -> PendingLine:
    p = _responses_plan(req)
    rid = f"resp_{request_id}"
    futures = client.submit_chat_n(p.messages, 1, request_id=request_id, **{**p.sampling, "priority": JOB_PRIORITY})
    shell = Shell(req, rid, model, int(time.time()))

    def respond(done: list[Completion]) -> dict[str, Any]:
        return shell.response(status_of(done[0]), output_items(done[0]), response_usage(done[0]))
    return PendingLine(request_id, list(futures), respond)
