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
    runs = [llm.ask("My favourite animal is", max_tokens=16, temperature=1.0, seed=s, top_logprobs=20,
                    ignore_eos=True) for s in (1, 1, 2, 3)]  # ignore_eos: an EOG is drawn and reported as any token
    assert_same_draws_while_the_logits_are_the_same(runs[0], runs[1])
    assert len({c.text for c in runs}) >= 2


def assert_same_draws_while_the_logits_are_the_same(a: llamactor.Completion, b: llamactor.Completion) -> None:
    """One seed, one prompt: the same tokens, or the first different one drawn from distributions
    that differ (float noise of another KV layout can move a draw across a boundary; with equal
    logits the same random draw must pick the same token)."""
    if a.token_ids == b.token_ids:
        assert a.text == b.text
        return
    i = next((k for k, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
    assert i is not None, "one seeded completion stopped where the other, with the same draws, went on"
    assert a.logprobs is not None and b.logprobs is not None
    assert a.logprobs[i].top != b.logprobs[i].top, f"token {i} differs although both drew from the same logits"


def test_logprobs_are_returned_per_generated_token_with_the_top_alternatives(llm: llamactor.LLM) -> None:
    c = llm.ask("One, two, three,", max_tokens=5, temperature=0, top_logprobs=3, ignore_eos=True)
    assert c.logprobs is not None and len(c.logprobs) == 5
    assert "".join(lp.token for lp in c.logprobs) == c.text
    for lp in c.logprobs:
        assert lp.logprob <= 0 and len(lp.top) == 3
        assert lp.top[0] == (lp.token, pytest.approx(lp.logprob))  # greedy: the chosen token is the best
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
    assert llm.ask("One, two,", max_tokens=2).logprobs is None


def test_a_base_model_chats_as_a_plain_transcript_and_answers_in_one_turn(llm: llamactor.LLM) -> None:
    # The default GGUF has no chat template: a pretrained model, prompted as User:/Assistant: lines.
    assert llm.info.looks_like_base_model and llm.info.chat_template.startswith("transcript")
    c = llm.chat([{"role": "system", "content": "You answer questions about geography."},
                  {"role": "user", "content": "What is the capital of France?"}], max_tokens=200, temperature=0)
    assert c.finish_reason == "stop" and "Paris" in c.text and "User:" not in c.text and len(c.text) < 200
    rendered = "You answer questions about geography.\n\nUser: What is the capital of France?\nAssistant:"
    assert c.usage.prompt_tokens == llm.ask(rendered, max_tokens=1).usage.prompt_tokens
    # the turn markers are the chat's stops, not every request's
    raw = llm.ask("User: Hi\nAssistant: Hello\nUser: Bye\nAssistant:", max_tokens=8, temperature=0, ignore_eos=True)
    assert raw.usage.completion_tokens == 8


def test_a_chat_template_given_as_an_option_replaces_the_transcript(start_llm) -> None:
    template = "{{ bos_token }}{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}A:"
    llm = start_llm(chat_template=template, n_parallel=2)
    assert llm.info.chat_template.startswith("override")
    c = llm.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=12, temperature=0,
                 ignore_eos=True)
    assert c.usage.prompt_tokens == llm.ask("Q: What is the capital of France?\nA:", max_tokens=1).usage.prompt_tokens
    assert c.usage.completion_tokens == 12  # no transcript stop strings with a real template
    with pytest.raises(llamactor.InvalidRequestError, match="not valid Jinja"):
        start_llm(chat_template="{% for m in messages %}")
