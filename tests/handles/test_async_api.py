"""The request API's coroutines on the real model: ``chat_async``, ``ask_n_async``, ``chat_n_async``,
``embed_async``.

The ``n`` forms build their choices like ``ask(n=...)``: one message per choice, ids ``<id>-<i>``
(the id itself when ``n`` is 1), seeds ``seed + i``, sent together so the prompt is computed once.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import llamactor
from llamactor import InvalidRequestError

from tests.conftest import record_sent


def assert_prompt_computed_once(choices: list[llamactor.Completion], computed: int) -> None:
    """The first choice computed the prompt (beyond what was cached, such as the BOS of earlier
    requests); the others attached its KV and computed only their last prompt token."""
    n_prompt = choices[0].usage.prompt_tokens
    first, *siblings = sorted(choices, key=lambda c: c.usage.cached_tokens)
    assert {c.usage.prompt_tokens for c in choices} == {n_prompt} and first.usage.cached_tokens < n_prompt // 2
    assert [c.usage.cached_tokens for c in siblings] == [n_prompt - 1] * len(siblings)
    assert computed == n_prompt - first.usage.cached_tokens + len(siblings)


def test_chat_async_answers_the_chat_as_chat_does(llm: llamactor.LLM) -> None:
    messages = [{"role": "user", "content": "Name three colours of the sea at dawn."}]

    async def main() -> list[llamactor.Completion]:
        return await asyncio.gather(*(llm.chat_async(messages, max_tokens=5, ignore_eos=True, seed=i) for i in range(3)))

    answers = asyncio.run(main())
    sync = llm.chat(messages, max_tokens=1)
    assert [c.usage.completion_tokens for c in answers] == [5, 5, 5]
    # rendered with the chat template, as chat() renders it
    assert {c.usage.prompt_tokens for c in answers} == {sync.usage.prompt_tokens}
    assert len({c.request_id for c in answers}) == 3
    with pytest.raises(InvalidRequestError, match="role"):
        asyncio.run(llm.chat_async([{"role": "wizard", "content": "hi"}]))


def test_ask_n_async_gives_n_choices_seeded_seed_plus_i_with_the_prompt_computed_once(
        llm: llamactor.LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    prompt = "Once upon a time, in a lighthouse on a rocky island far to the north, there lived"
    sent = record_sent(llm, monkeypatch)
    before = llm.stats()["prompt_tokens_computed"]
    choices = asyncio.run(llm.ask_n_async(prompt, 3, request_id="tale", max_tokens=6, temperature=0.9, seed=5,
                                          ignore_eos=True))
    assert [(m.request_id, m.params.seed) for m in sent] == [("tale-0", 5), ("tale-1", 6), ("tale-2", 7)]
    assert [c.request_id for c in choices] == ["tale-0", "tale-1", "tale-2"]
    assert [c.usage.completion_tokens for c in choices] == [6, 6, 6]
    assert_prompt_computed_once(choices, llm.stats()["prompt_tokens_computed"] - before)
    (solo,) = asyncio.run(llm.ask_n_async(prompt, 1, request_id="solo", max_tokens=2))
    assert solo.request_id == "solo"  # one choice: the request's own id
    with pytest.raises(InvalidRequestError, match="n must be"):
        asyncio.run(llm.ask_n_async(prompt, 0))


def test_chat_n_async_gives_n_chat_choices_of_one_rendered_prompt(llm: llamactor.LLM,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    messages = [{"role": "system", "content": "You are a harbour master who answers briefly."},
                {"role": "user", "content": "Which boats came in this morning?"}]
    sent = record_sent(llm, monkeypatch)
    before = llm.stats()["prompt_tokens_computed"]
    choices = asyncio.run(llm.chat_n_async(messages, 2, max_tokens=4, temperature=0.9, seed=11, ignore_eos=True))
    assert [m.params.seed for m in sent] == [11, 12] and all(m.messages == tuple(messages) for m in sent)
    base = sent[0].request_id[:-2]
    assert [c.request_id for c in choices] == [f"{base}-0", f"{base}-1"]
    assert_prompt_computed_once(choices, llm.stats()["prompt_tokens_computed"] - before)


def test_embed_async_embeds_as_embed_does_and_many_share_a_loop(llm: llamactor.LLM) -> None:
    texts = ["The tide comes in twice a day.", "Gulls follow the fishing boats.", "The lamp turns all night."]

    async def main() -> list[llamactor.Embeddings]:
        return await asyncio.gather(llm.embed_async(texts), *(llm.embed_async(t, dimensions=32) for t in texts))

    together, *short = asyncio.run(main())
    assert together.vectors.shape == (3, llm.info.n_embd)
    for text, vector, truncated in zip(texts, together, short, strict=True):
        alone = llm.embed(text)[0]
        assert float(np.dot(vector, alone)) >= 0.999  # unit vectors: the dot product is the cosine
        assert truncated.vectors.shape == (1, 32) and abs(np.linalg.norm(truncated[0]) - 1) < 1e-5
        assert float(np.dot(truncated[0], alone[:32] / np.linalg.norm(alone[:32]))) >= 0.999  # its first 32
    with pytest.raises(InvalidRequestError, match="n_ubatch"):
        asyncio.run(llm.embed_async(["short", "word " * 600]))
