"""The tokenizer and template endpoints of llama-server and vLLM: ``/tokenize``, ``/detokenize``,
``/tokenizer_info``, ``/apply-template``, at the root and under ``/v1`` (uvicorn's event loop).
What they take and answer is ``llamactor.dialects.tokenizer``; each makes one trip to the
batcher (``Client.tokenize``), which alone calls llama.cpp.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from llamactor.base.completion import Tokenized
from llamactor.dialects import tokenizer as dialect
from llamactor.handles.model import ModelClient
from llamactor.http.request_path import ready_model
from llamactor.http.state import State

router = APIRouter()


async def tokenized(llm: ModelClient, call: dialect.TokenizeCall) -> Tokenized | None:
    return await llm.tokenize_async(call.prompt, **call.options()) if call.prompt is not None else None


@router.post("/tokenize")
async def tokenize(body: dialect.TokenizeRequest, state: State) -> dict[str, Any]:
    call = dialect.plan_tokenize(body)
    llm = await ready_model(state, body.model)
    return dialect.tokenize_reply(body, await tokenized(llm, call), llm.info)


@router.post("/detokenize")
async def detokenize(body: dialect.DetokenizeRequest, state: State) -> dict[str, Any]:
    llm = await ready_model(state, body.model)
    text = (await llm.tokenize_async(body.tokens)).text if body.tokens else ""
    return {"content": text, "prompt": text}


@router.get("/tokenizer_info")
async def tokenizer_info(state: State, model: str | None = None) -> dict[str, Any]:
    llm = await ready_model(state, model)
    ids = dialect.special_token_ids(llm.info)
    # every special token's text in one batcher round trip
    pieces = (await llm.tokenize_async(list(ids.values()), with_pieces=True)).pieces if ids else ()
    return dialect.tokenizer_info_reply(llm.info, dict(zip(ids, pieces or ())))


@router.post("/apply-template")
async def apply_template(body: dialect.ApplyTemplateRequest, state: State) -> dict[str, Any]:
    call = dialect.plan_apply_template(body)
    llm = await ready_model(state, body.model)
    done = await tokenized(llm, call)
    return {"prompt": done.text if done is not None else ""}
