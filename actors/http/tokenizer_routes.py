"""The tokenizer and template endpoints of llama-server and vLLM: ``/tokenize``, ``/detokenize``,
``/tokenizer_info``, ``/apply-template``, at the root and under ``/v1`` (uvicorn's event loop).
What they take and answer is ``llamactor.dialects.tokenizer``; each makes one trip to the
batcher (``Client.tokenize``), which alone calls llama.cpp: engine work, so each is the tenant's
request under its requests and tokens per minute (``request_path.tokenize``), and none loads a
model a tenant may not load.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from llamactor.base.completion import Tokenized
from llamactor.dialects import tokenizer as dialect
from llamactor.handles.model import ModelClient
from llamactor.http.request_path import ready_model, tokenize as limited_tokenize
from llamactor.http.state import ServerState, State

router = APIRouter()


async def tokenized(state: ServerState, request: Request, llm: ModelClient,
                    call: dialect.TokenizeCall) -> Tokenized | None:
    if call.prompt is None:
        return None
    return await limited_tokenize(state, request, llm, call.prompt, **call.options())


@router.post("/tokenize")
async def tokenize(body: dialect.TokenizeRequest, request: Request, state: State) -> dict[str, Any]:
    call = dialect.tokenize_call(body)
    llm = await ready_model(state, request, body.model)
    return dialect.tokenize_reply(body, await tokenized(state, request, llm, call), llm.info)


@router.post("/detokenize")
async def detokenize(body: dialect.DetokenizeRequest, request: Request, state: State) -> dict[str, Any]:
    llm = await ready_model(state, request, body.model)
    text = (await limited_tokenize(state, request, llm, body.tokens)).text if body.tokens else ""
    return {"content": text, "prompt": text}


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request, state: State, model: str | None = None) -> dict[str, Any]:
    llm = await ready_model(state, request, model)
    ids = dialect.special_token_ids(llm.info)
    # every special token's text in one batcher round trip
    pieces = (await limited_tokenize(state, request, llm, list(ids.values()), with_pieces=True)).pieces if ids else ()
    return dialect.tokenizer_info_reply(llm.info, dict(zip(ids, pieces or ())))


@router.post("/apply-template")
async def apply_template(body: dialect.ApplyTemplateRequest, request: Request, state: State) -> dict[str, Any]:
    call = dialect.apply_template_call(body)
    llm = await ready_model(state, request, body.model)
    done = await tokenized(state, request, llm, call)
    return {"prompt": done.text if done is not None else ""}
