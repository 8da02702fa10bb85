"""A configured system prompt is prefilled once and attached to every sequence by seq_cp."""

from __future__ import annotations

import pytest

SYSTEM = ("You are a helpful assistant for a bakery. You answer questions about bread, cakes and opening hours "
          "politely and briefly.\n")
from tests.conftest import assert_equal_up_to_near_tie

QUESTIONS = ["When do you open?", "Do you sell rye bread?", "How much is a cake?", "Is there parking?"]


def test_the_shared_system_prompt_is_computed_once_and_answers_match_the_inlined_prompt(
        start_llm, reference_engine) -> None:
    shared = start_llm(n_parallel=4, system_prompt=SYSTEM)
    with_shared = [f.result() for f in [shared.submit(q, max_tokens=16, temperature=0) for q in QUESTIONS]]
    n_system = with_shared[0].usage.cached_tokens
    assert n_system > 20
    assert all(c.usage.cached_tokens == n_system for c in with_shared)
    stats = shared.stats()
    # Only the questions were computed per request; the system prompt's KV came from seq_cp.
    assert stats["prompt_tokens_computed"] == sum(c.usage.prompt_tokens - n_system for c in with_shared)
    assert stats["tokens_cached"] == 4 * n_system

    inline = start_llm(n_parallel=4)
    inlined = [f.result() for f in [inline.submit(SYSTEM + q, max_tokens=16, temperature=0) for q in QUESTIONS]]
    assert [c.usage.prompt_tokens for c in inlined] == [c.usage.prompt_tokens for c in with_shared]
    assert all(c.usage.cached_tokens == 0 for c in inlined)
    for q, a, b in zip(QUESTIONS, with_shared, inlined):
        assert_equal_up_to_near_tie(reference_engine, reference_engine.tokenizer.tokenize(SYSTEM + q), a, b)


@pytest.mark.parametrize("instruct", [False, True], ids=["transcript", "instruct-template"])
def test_chat_requests_reuse_the_chat_formatted_system_prompt(start_llm, instruct_path, instruct: bool) -> None:
    llm = start_llm(model=instruct_path if instruct else None, n_parallel=2, system_prompt=SYSTEM)
    c = llm.chat([{"role": "user", "content": "Do you bake croissants?"}], max_tokens=8, temperature=0)
    assert c.usage.cached_tokens > 20  # BOS, the turn header and the system text
    own = llm.chat([{"role": "system", "content": "Be rude."}, {"role": "user", "content": "Hi"}], max_tokens=4)
    assert own.usage.cached_tokens < 10  # a request's own system message replaces the configured one
