"""One batch line as the requests its endpoint would make, and the response body its HTTP call
would answer: the dialects' own schemas, plans and replies (``llamactor.dialects``), the very
ones the routes call, so a line's output is what ``POST /v1/chat/completions`` (``/v1/completions``,
``/v1/embeddings``, ``/v1/responses``) gives for that body.

A job's requests go in at ``low`` priority (a body's ``priority`` is overridden): interactive
callers come first, aging still lets the job through under constant load. Runs on the runner's
thread; only builds requests and reads finished results.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import InvalidRequestError
from llamactor.base.priority import parse_priority
from llamactor.base.request import GenerationRequest
from llamactor.base.tenants import DEFAULT, Tenant
from llamactor.dialects.context import RequestContext
from llamactor.dialects.openai.call import chat_call, completions_call
from llamactor.dialects.openai.embeddings import EmbeddingsBody, embeddings_reply, embeddings_request
from llamactor.dialects.openai.replies import chat_reply, completion_reply
from llamactor.dialects.openai.schema import ChatRequest, CompletionRequest
from llamactor.dialects.responses.call import ResponsesCall, response_call
from llamactor.dialects.responses.output_items import response_reply
from llamactor.dialects.responses.schema import ResponsesRequest
from llamactor.handles.client import Client

JOB_PRIORITY = parse_priority("low")
Reply = Callable[[list[Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class LinePlan:
    """What a line makes: generation requests, or one embedding request; and its reply."""

    requests: list[GenerationRequest]
    reply: Reply
    embedding: Any = None  # an EmbeddingRequest (the embeddings endpoint)


def _chat(body: dict[str, Any], ctx: RequestContext) -> LinePlan:
    plan = chat_call(ChatRequest.model_validate(body), ctx)
    return LinePlan(plan.requests, lambda done: chat_reply(plan, done))


def _completions(body: dict[str, Any], ctx: RequestContext) -> LinePlan:
    plan = completions_call(CompletionRequest.model_validate(body), ctx)
    return LinePlan(plan.requests, lambda done: completion_reply(plan, done))


def _embeddings(body: dict[str, Any], ctx: RequestContext) -> LinePlan:
    request = EmbeddingsBody.model_validate(body)
    return LinePlan([], lambda done: embeddings_reply(done[0], request, ctx), embeddings_request(request, ctx))


def _responses(body: dict[str, Any], ctx: RequestContext) -> LinePlan:
    request = ResponsesRequest.model_validate(body)
    # A batch line stands alone: the daemon's in-memory store of earlier responses is no journal.
    if request.previous_response_id is not None:
        raise InvalidRequestError("previous_response_id is not supported in a batch: send the conversation as input")
    plan: ResponsesCall = response_call(request, ctx)
    return LinePlan(plan.requests, lambda done: response_reply(plan.shell, done[0]))


PLANS: dict[str, Callable[[dict[str, Any], RequestContext], LinePlan]] = {
    "/v1/chat/completions": _chat, "/v1/completions": _completions, "/v1/embeddings": _embeddings,
    "/v1/responses": _responses}
SCHEMAS: dict[str, type[BaseModel]] = {"/v1/chat/completions": ChatRequest, "/v1/completions": CompletionRequest,
                                       "/v1/embeddings": EmbeddingsBody, "/v1/responses": ResponsesRequest}


def check_body(endpoint: str, body: dict[str, Any]) -> str | None:
    """What the endpoint would refuse in ``body`` (its 400's message), or None: the schema
    (unknown fields included), then everything its plan checks (grammars, tools ...)."""
    try:
        PLANS[endpoint](body, RequestContext("check", "", SamplingParams(), adapters=None))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = str(first.get("msg", "invalid body")).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    except InvalidRequestError as e:
        return str(e)
    return None


@dataclass(slots=True)
class PendingLine:
    """A line's requests in flight: its futures, and how their results become the response body."""

    request_id: str
    futures: list[concurrent.futures.Future[Any]]
    respond: Reply

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def response_body(self) -> dict[str, Any]:
        """The body (raises the first failure: the line failed)."""
        return self.respond([f.result() for f in self.futures])

    def cancel(self) -> None:
        for f in self.futures:
            f.cancel()


def start_line(client: Client, endpoint: str, body: dict[str, Any], request_id: str, model_name: str,
               tenant: Tenant = DEFAULT) -> PendingLine:
    """Queue the line's requests on ``client`` as ``tenant``'s (the batch's owner: its cache scope,
    its fair share); ``InvalidRequestError`` (and the other typed errors of ``submit``) if they
    are refused before queueing."""
    if endpoint not in PLANS:
        raise InvalidRequestError(f"unsupported batch endpoint {endpoint}")
    line = PLANS[endpoint](body, RequestContext(request_id, model_name, client.sampling_defaults(),
                                                adapters=client.config.lora_names,
                                                tool_format=client.tool_format()))
    if line.embedding is not None:  # embedding steps have their own queue and time share: no priority
        return PendingLine(request_id, [client.submit_embed(dataclasses.replace(line.embedding, tenant=tenant))],
                           line.reply)
    futures = [f for r in line.requests
               for f in client.submit(dataclasses.replace(r.for_tenant(tenant), priority=JOB_PRIORITY))]
    return PendingLine(request_id, futures, line.reply)
