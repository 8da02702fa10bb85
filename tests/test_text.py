"""What callers read: streamed pieces, stop strings, UTF-8, seeded sampling, chat."""

from __future__ import annotations

import pytest

import llamactor


def test_stop_strings_end_the_answer_before_the_stop_text_in_stream_and_result(llm: llamactor.LLM) -> None:
    stream = llm.stream("The capital of France is", max_tokens=40, temperature=0, stop=["."])
    pieces = list(stream)
    c = stream.completion
    assert c.finish_reason == "stop" and "." not in c.text and c.text
    assert "".join(pieces) == c.text


def test_streamed_utf8_pieces_are_whole_characters_that_join_to_the_final_text(llm: llamactor.LLM) -> None:
    stream = llm.stream("日本の首都は東京です。大阪は", max_tokens=30, temperature=0)
    pieces = list(stream)
    assert "".join(pieces) == stream.completion.text
    assert all("\ufffd" not in p for p in pieces)
    assert any(ord(ch) > 0x3000 for ch in stream.completion.text)


def test_the_same_seed_gives_the_same_text_and_other_seeds_vary(llm: llamactor.LLM) -> None:
    # The first request computes the whole prompt in one batch; later ones attach its cached KV and
    # compute only the last token, in a batch of another shape (slightly other logits). So compare
    # requests that all find the prompt cached, as a warm server's do.
    llm.ask("My favourite animal is", max_tokens=1)
    texts = [llm.ask("My favourite animal is", max_tokens=16, temperature=1.0, seed=s).text for s in (1, 1, 2, 3)]
    assert texts[0] == texts[1]
    assert len(set(texts)) >= 2


def test_logprobs_are_returned_per_generated_token_with_the_top_alternatives(llm: llamactor.LLM) -> None:
    c = llm.ask("One, two, three,", max_tokens=5, temperature=0, top_logprobs=3, ignore_eos=True)
    assert c.logprobs is not None and len(c.logprobs) == 5
    assert "".join(lp.token for lp in c.logprobs) == c.text
    for lp in c.logprobs:
        assert lp.logprob <= 0 and len(lp.top) == 3
        assert lp.top[0] == (lp.token, pytest.approx(lp.logprob))  # greedy: the chosen token is the best
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
    assert llm.ask("One, two,", max_tokens=2).logprobs is None


def test_chat_applies_the_template_and_stops_at_the_end_of_turn(llm: llamactor.LLM) -> None:
    c = llm.chat([{"role": "user", "content": "Say hello."}], max_tokens=64, temperature=0)
    assert c.usage.prompt_tokens > 5 and c.finish_reason in ("stop", "length")
    assert "<start_of_turn>" not in c.text and "<end_of_turn>" not in c.text
