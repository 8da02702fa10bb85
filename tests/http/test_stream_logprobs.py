"""Streamed logprobs cover every generated token, as a whole answer's do, through the daemon and the
official clients: also the tokens whose text a stream held back and never sent -- a stop string's,
and a control token's at the end (its text is empty) -- which come with the last chunk.

Within one answer the checks are exact: the streamed tokens join to the streamed text (and, when a
stop string ended it, the stop string after it), and there is one logprob per completion token of
its usage. Against the whole answer of the same request (another decode) they agree up to a near-tie.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ollama
import pytest

from tests.support.daemon import (Daemon, assert_same_greedy_text_up_to_near_tie, chat_result, chat_steps, legacy_result,
                                  start_daemon, streamed_chat_result, streamed_legacy_result)

COUNT_PROMPT = "One, two, three, four,"  # the base model counts on: " five, six, seven, ..."
COUNT_CHAT = [{"role": "user", "content": "Count from one to ten: one, two, three,"}]
STOPS = {
    "stop string ends the answer": ([", six"], 12),  # ", six" is held back, then matches: never text
    "held text released at max_tokens": ([" six, seven, eight, nine, ten"], 5),  # held, then sent at the end
}


@pytest.fixture(scope="module")
def daemon(model_path: str, instruct_path: str) -> Iterator[Daemon]:
    d = start_daemon("--model", f"base={model_path}", "--model", f"instruct={instruct_path}")
    yield d
    assert d.stop() == 0


def assert_tokens_cover(text: str, tokens: list[str], stop: list[str], finish: str | None) -> None:
    """The tokens' texts are the answer's text, then (an answer a stop string ended) the stop string."""
    joined = "".join(tokens)
    assert joined.startswith(text), (joined, text)
    rest = joined[len(text):]
    assert rest.startswith(stop[0]) if finish == "stop" else rest == "", (rest, finish)


def completion_tokens(chunks: list[Any]) -> int:
    """The usage chunk's completion tokens (asked with ``include_usage``)."""
    return next(c.usage.completion_tokens for c in chunks if c.usage is not None)


@pytest.mark.parametrize("case", list(STOPS))
def test_a_streamed_chat_sends_the_logprobs_of_its_held_back_tokens(daemon: Daemon, case: str) -> None:
    stop, max_tokens = STOPS[case]
    ask: dict[str, Any] = dict(model="base", messages=COUNT_CHAT, max_tokens=max_tokens, temperature=0, stop=stop,
                               logprobs=True, top_logprobs=2)
    whole = daemon.client().chat.completions.create(**ask).choices[0]
    assert_tokens_cover(whole.message.content, [t.token for t in whole.logprobs.content], stop, whole.finish_reason)
    chunks = list(daemon.client().chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    text, steps, finish = streamed_chat_result(chunks)
    assert finish == ("stop" if case.startswith("stop") else "length")
    assert len(steps) == completion_tokens(chunks)
    assert_tokens_cover(text, [t.token for t in steps], stop, finish)
    assert_same_greedy_text_up_to_near_tie((text, steps, finish), chat_result(whole))


@pytest.mark.parametrize("case", list(STOPS))
def test_a_streamed_completion_sends_the_logprobs_of_its_held_back_tokens(daemon: Daemon, case: str) -> None:
    stop, max_tokens = STOPS[case]
    ask: dict[str, Any] = dict(model="base", prompt=COUNT_PROMPT, max_tokens=max_tokens, temperature=0, stop=stop,
                               logprobs=2)
    whole = daemon.client().completions.create(**ask).choices[0]
    assert_tokens_cover(whole.text, whole.logprobs.tokens, stop, whole.finish_reason)
    chunks = list(daemon.client().completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    text, steps, finish = streamed_legacy_result(chunks)  # a top_logprobs entry per token, or it raises
    assert finish == ("stop" if case.startswith("stop") else "length")
    assert len(steps) == completion_tokens(chunks)
    assert_tokens_cover(text, [t.token for t in steps], stop, finish)
    assert_same_greedy_text_up_to_near_tie((text, steps, finish), legacy_result(whole))


def test_a_stream_ending_on_a_control_token_sends_its_logprob(daemon: Daemon) -> None:
    """SmolLM2 told to ignore its end of turn writes ``<|im_end|>`` (no text) and goes on; a
    stream cut by max_tokens right after it still reports it."""
    ask: dict[str, Any] = dict(model="instruct", messages=[{"role": "user", "content": "Say hi"}], temperature=0,
                               logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    whole = daemon.client().chat.completions.create(**ask, max_tokens=40).choices[0]
    tokens = [t.token for t in whole.logprobs.content]
    assert "" in tokens, tokens  # the end-of-turn token, whose text is empty
    upto = tokens.index("") + 1
    chunks = list(daemon.client().chat.completions.create(**ask, max_tokens=upto, stream=True,
                                                          stream_options={"include_usage": True}))
    text, steps, finish = streamed_chat_result(chunks)
    assert finish == "length" and completion_tokens(chunks) == upto == len(steps)
    assert steps[-1].token == "" and "".join(t.token for t in steps) == text


def test_an_ollama_stream_sends_the_logprobs_of_a_stop_strings_tokens(daemon: Daemon) -> None:
    client = ollama.Client(host=daemon.url)
    stop, max_tokens = STOPS["stop string ends the answer"]
    options = {"temperature": 0, "num_predict": max_tokens, "stop": stop}
    whole = client.chat(model="base", messages=COUNT_CHAT, options=options, logprobs=True, top_logprobs=2)
    chunks = list(client.chat(model="base", messages=COUNT_CHAT, options=options, logprobs=True, top_logprobs=2,
                              stream=True))
    streamed = [lp for c in chunks for lp in c.logprobs or []]
    text, last = "".join(c.message.content for c in chunks), chunks[-1]
    assert last.done_reason == "stop" and len(streamed) == last.eval_count
    assert_tokens_cover(text, [lp.token for lp in streamed], stop, "stop")
    assert_same_greedy_text_up_to_near_tie((text, chat_steps(streamed), last.done_reason),
                                           (whole.message.content, chat_steps(whole.logprobs), whole.done_reason))
