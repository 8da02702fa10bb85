"""The rerank and score routes (uvicorn's event loop): ``/rerank``, ``/v1/rerank``, ``/v2/rerank``
(Cohere's, Jina's, vLLM's; TEI's when the body has ``texts``), llama-server's ``/reranking`` and
``/v1/reranking``, and vLLM's ``/score`` and ``/v1/score``. What a body means and how an answer
looks is ``llamactor.dialects.rerank``; each body is checked whole (every 400) before its model
is loaded. A rerank is the tenant's request, under its rate limits and priority ceiling
(``reranked``; Ollama's ``/api/rerank`` goes through it too); a client that disconnects cancels it.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from llamactor.dialects.context import RequestContext
from llamactor.dialects.rerank.call import DIALECT, RerankCall, rerank_call, score_calls
from llamactor.dialects.rerank.replies import rerank_reply, score_reply
from llamactor.dialects.rerank.schema import RerankBody, ScoreBody
from llamactor.handles.model import ModelClient
from llamactor.http.request_path import context, find_model, gather, load, warn_ignored
from llamactor.http.state import ServerState, State, tenant_of
from llamactor.scheduling.rate_limits import estimate_tokens

router = APIRouter()


async def reranked(state: ServerState, request: Request, llm: ModelClient, calls: list[RerankCall],
                   ctx: RequestContext, dialect: str = DIALECT) -> list[Any]:
    """Each call's ``Reranking``, sent together within the tenant's rate limits (a 429 before
    anything is queued; the estimate settled with the tokens computed) at its priority under the
    tenant's ceiling; cancelled if the client disconnects first. The request counts in the
    metrics as one of the tenant's, and the tokens they computed in the prompt tokens (by
    ``dialect``: the one the request came in, and by tenant)."""
    tenant = tenant_of(request)

    def send() -> list[Future[Any]]:
        sent: list[Future[Any]] = []
        try:
            for i, c in enumerate(calls):
                rid = ctx.id("rerank-") + (f"-{i}" if len(calls) > 1 else "")
                sent.append(llm.submit_rerank(c.query, list(c.documents), **c.options(), tenant=tenant,
                                              request_id=rid, priority=tenant.priority(c.priority)))
        except BaseException:
            for f in sent:  # a later call refused: the ones already sent are not wanted
                f.cancel()
            raise
        return sent

    tokens = estimate_tokens(sum(c.estimate for c in calls), 0, 0, 0) + sum(len(c.documents) for c in calls)
    futures, request.state.rate_limits = state.limiter.submit(tenant, tokens, send)
    done = await gather(request, futures)
    state.metrics.count_rerank(llm.name, dialect, tenant.name, sum(r.prompt_tokens for r in done))
    return done


async def _rerank(body: RerankBody, request: Request, state: ServerState, api_version: str) -> JSONResponse:
    llm = find_model(state, body.model)
    call = rerank_call(body, llm.config.max_rerank_documents)  # a bad body: 400 before the model loads
    ctx = context(request, llm, body.model)
    warn_ignored(DIALECT, call.ignored, ctx.request_id)
    [done] = await reranked(state, request, await load(llm, request), [call], ctx)
    return JSONResponse(rerank_reply(call, done, ctx, api_version))


@router.post("/v1/rerank", response_model=None)
async def rerank_v1(body: RerankBody, request: Request, state: State) -> JSONResponse:
    """Jina's, Cohere v1's, llama-server's and vLLM's rerank (TEI's with ``texts``)."""
    return await _rerank(body, request, state, "1")


@router.post("/v2/rerank", response_model=None)
async def rerank_v2(body: RerankBody, request: Request, state: State) -> JSONResponse:
    """Cohere v2's rerank (the same body and answer; ``meta.api_version`` says 2)."""
    return await _rerank(body, request, state, "2")


@router.post("/rerank", response_model=None)
@router.post("/reranking", response_model=None)
@router.post("/v1/reranking", response_model=None)
async def rerank_root(body: RerankBody, request: Request, state: State) -> JSONResponse:
    """llama-server's and vLLM's other names for ``/v1/rerank`` (TEI's ``/rerank``)."""
    return await _rerank(body, request, state, "1")


@router.post("/score", response_model=None)
@router.post("/v1/score", response_model=None)
async def score(body: ScoreBody, request: Request, state: State) -> JSONResponse:
    """vLLM's pairs scored, in their order."""
    llm = find_model(state, body.model)
    calls = score_calls(body, llm.config.max_rerank_documents)
    ctx = context(request, llm, body.model)
    warn_ignored(DIALECT, calls[0].ignored, ctx.request_id)
    done = await reranked(state, request, await load(llm, request), calls, ctx)
    return JSONResponse(score_reply(calls, done, ctx))
