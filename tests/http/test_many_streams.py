"""Many SSE streams at once through the real daemon: each gets every piece, in order, whether its
chunks are made from the prepared template (no logprobs) or as dicts (logprobs), and whether the
front end wrote them one at a time or several in one write. Legacy completions: a raw prompt has
no chat transcript whose next turn would stop it early (every token streams)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import NEAR_TIE
from tests.support.daemon import API_KEY, MODEL_ID, Daemon, GreedyStep, start_daemon, streamed_legacy_result

N_STREAMS = 32
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", str(N_STREAMS), "--n-ctx", "8192", "--api-key", API_KEY)
    yield d
    assert d.stop() == 0


async def _streams(client: openai.AsyncOpenAI, logprobs: bool) -> list[tuple[list[Any], Any]]:
    async def one(i: int) -> tuple[list[Any], Any]:
        extra: dict[str, Any] = {"logprobs": 2} if logprobs else {}
        chunks = [c async for c in await client.completions.create(
            model=MODEL_ID, prompt=f"Facts about the number {i}:", max_tokens=NEW_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, **extra)]
        return chunks[:-1], chunks[-1].usage
    return list(await asyncio.gather(*(one(i) for i in range(N_STREAMS))))


def _same_up_to_near_tie(text: str, reference: tuple[str, list[GreedyStep], str | None]) -> None:
    """``text`` is the reference's, or parts from it inside a token the reference nearly tied on."""
    ref_text, steps, _ = reference
    if text == ref_text:
        return
    at = next((k for k, (a, b) in enumerate(zip(text, ref_text)) if a != b), min(len(text), len(ref_text)))
    end = 0
    for step in steps:
        end += len(step.token)
        if end > at or step is steps[-1]:
            assert step.margin < NEAR_TIE, f"parted at {at} without a near tie: {text!r} vs {ref_text!r}"
            return


def test_many_concurrent_sse_streams_each_get_every_piece_in_order(daemon: Daemon) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        async with openai.AsyncOpenAI(base_url=f"{daemon.url}/v1", api_key=API_KEY, max_retries=0) as client:
            return await _streams(client, logprobs=True), await _streams(client, logprobs=False)

    with_logprobs, templated = asyncio.run(both())
    for (ref_chunks, ref_usage), (chunks, usage) in zip(with_logprobs, templated, strict=True):
        reference = streamed_legacy_result(ref_chunks)
        # every token came with its piece, and the pieces joined are what the usage counted
        assert len(reference[1]) == ref_usage.completion_tokens == usage.completion_tokens == NEW_TOKENS
        assert "".join(s.token for s in reference[1]) == reference[0]
        assert chunks[-1].choices[0].finish_reason == "length"
        assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
        _same_up_to_near_tie("".join(c.choices[0].text for c in chunks), reference)
