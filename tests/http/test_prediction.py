"""OpenAI's Predicted Outputs through the real daemon and the official ``openai`` client: the SDK's
``prediction`` parameter answers what the model says without it (greedy, up to a near-tie: drafts
change a step's shape), ``usage.completion_tokens_details`` reports the drafted tokens accepted and
rejected, whole and in the streamed usage chunk, /metrics adds them up, and a malformed prediction
is a 400 before any stream starts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.support.daemon import (MODEL_ID, Daemon, assert_same_greedy_text_up_to_near_tie, chat_result,
                                  legacy_result, metric, start_daemon, streamed_chat_result, wait_until)

ASK = [{"role": "user", "content": "Write a Python function add(a, b) that returns a + b. Answer with the code only."}]
UNRELATED = "The quick brown fox jumps over the lazy dog. " * 4


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "2")
    yield d
    assert d.stop() == 0


def greedy_chat(client: openai.OpenAI, **fields: Any) -> Any:
    return client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=48, temperature=0,  # type: ignore[arg-type]
                                          logprobs=True, top_logprobs=2, **fields)


def drafted(usage: Any) -> tuple[int, int]:
    """A usage's (accepted, rejected) prediction tokens, both required to be there."""
    details = usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens is not None
    assert details.rejected_prediction_tokens is not None
    return details.accepted_prediction_tokens, details.rejected_prediction_tokens


@pytest.mark.timeout(300)  # a daemon and 2-4 greedy requests: ~20 s alone, ~75 s on 2 busy cores
def test_a_predicted_output_answers_what_the_model_says_and_reports_its_drafted_tokens(daemon: Daemon) -> None:
    client = daemon.client()
    plain = greedy_chat(client)
    answer = plain.choices[0].message.content
    assert answer and drafted(plain.usage) == (0, 0)  # nothing drafted without a prediction
    for prediction in (answer, UNRELATED, [{"type": "text", "text": answer[:20]}, {"type": "text", "text": answer[20:]}]):
        predicted = greedy_chat(client, prediction={"type": "content", "content": prediction})
        assert_same_greedy_text_up_to_near_tie(chat_result(plain.choices[0]), chat_result(predicted.choices[0]))
        accepted, rejected = drafted(predicted.usage)
        assert accepted >= 0 and rejected >= 0
        if prediction == answer:  # the model's own answer: its drafts are taken (one stream: drafting pays)
            assert 0 < accepted <= predicted.usage.completion_tokens


def test_a_prediction_combines_with_what_openai_refuses_beside_it(daemon: Daemon) -> None:
    """n > 1, logprobs and penalties: verification changes no output, so nothing is refused."""
    client = daemon.client()
    plain = greedy_chat(client, frequency_penalty=0.5)
    both = greedy_chat(client, n=2, frequency_penalty=0.5,
                       prediction={"type": "content", "content": plain.choices[0].message.content})
    assert len(both.choices) == 2 and both.usage.completion_tokens == sum(
        len(c.logprobs.content) for c in both.choices)
    for choice in both.choices:
        assert_same_greedy_text_up_to_near_tie(chat_result(plain.choices[0]), chat_result(choice))
    drafted(both.usage)


def test_the_streamed_usage_chunk_reports_the_drafted_tokens(daemon: Daemon) -> None:
    client = daemon.client()

    def streamed(**fields: Any) -> list[Any]:
        chunks = list(greedy_chat(client, stream=True, stream_options={"include_usage": True}, **fields))
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        return chunks
    plain = streamed()
    answer = streamed_chat_result(plain)[0]
    predicted = streamed(prediction={"type": "content", "content": answer})
    accepted, rejected = drafted(predicted[-1].usage)
    assert drafted(plain[-1].usage) == (0, 0) and 0 < accepted <= predicted[-1].usage.completion_tokens
    assert rejected >= 0
    assert_same_greedy_text_up_to_near_tie(streamed_chat_result(plain), streamed_chat_result(predicted))


def test_completions_take_a_prediction_and_ngram_speculation_as_extra_body(daemon: Daemon) -> None:
    client = daemon.client()

    def legacy(**extra: Any) -> Any:
        return client.completions.create(model=MODEL_ID, prompt="def add(a, b):\n    return", max_tokens=16,
                                         temperature=0, logprobs=2, extra_body=extra or None)
    plain = legacy()
    for extra in ({"prediction": {"type": "content", "content": plain.choices[0].text}}, {"speculation": "ngram"}):
        other = legacy(**extra)
        assert_same_greedy_text_up_to_near_tie(legacy_result(plain.choices[0]), legacy_result(other.choices[0]))
        drafted(other.usage)


def test_metrics_add_up_the_drafted_tokens_of_finished_requests_and_of_the_batcher(daemon: Daemon) -> None:
    client = daemon.client()
    by_dialect = f'{{dialect="openai",model="{MODEL_ID}"}}'
    by_replica = f'{{model="{MODEL_ID}",replica="0"}}'
    series = {"accepted": f"llamactor_accepted_prediction_tokens_total{by_dialect}",
              "rejected": f"llamactor_rejected_prediction_tokens_total{by_dialect}",
              "verified": f"llamactor_spec_decode_draft_tokens_total{by_replica}",
              "step_accepted": f"llamactor_spec_decode_accepted_tokens_total{by_replica}",
              "step_rejected": f"llamactor_spec_decode_rejected_tokens_total{by_replica}"}

    def scrape() -> dict[str, float]:
        text = httpx.get(f"{daemon.url}/metrics").text
        return {k: metric(text, re.escape(s)) for k, s in series.items()}
    before = scrape()
    answer = greedy_chat(client).choices[0].message.content
    accepted, rejected = drafted(greedy_chat(client, prediction={"type": "content", "content": answer}).usage)
    want = {"accepted": accepted, "rejected": rejected, "verified": accepted + rejected, "step_accepted": accepted,
            "step_rejected": rejected}
    # the batcher's counters are published stats: at most 50 ms old while busy, exact once idle
    wait_until(lambda: {k: v - before[k] for k, v in scrape().items()} == want, "the drafted tokens counted")


COPY = "The river flows past the old mill, under the stone bridge, and on to the sea. " * 3
QUOTING = [{"role": "user", "content": "Repeat this text exactly:\n" + COPY}]


def proposed(d: Daemon) -> float:
    """Tokens the daemon's drafters proposed (verified or not: the budget's grant depends on step
    timings, the proposals only on the text)."""
    series = f'llamactor_spec_decode_proposed_tokens_total{{model="{MODEL_ID}",replica="0"}}'
    return metric(httpx.get(f"{d.url}/metrics").text, re.escape(series))


@pytest.fixture(scope="module")
def ngram_daemon() -> Iterator[Daemon]:
    """A daemon whose operator made n-gram drafts the default."""
    d = start_daemon("--n-parallel", "2", "--speculation", "ngram")
    yield d
    assert d.stop() == 0


@pytest.mark.timeout(300)  # a daemon and 2-4 greedy requests: ~20 s alone, ~75 s on 2 busy cores
def test_ngram_drafts_as_the_servers_default_are_turned_off_per_request(ngram_daemon: Daemon) -> None:
    client = ngram_daemon.client()

    def quoting(**extra: Any) -> Any:
        return client.chat.completions.create(model=MODEL_ID, messages=QUOTING, max_tokens=32, temperature=0,  # type: ignore[arg-type]
                                              logprobs=True, top_logprobs=2, extra_body=extra or None)
    before = proposed(ngram_daemon)
    default, off = quoting(), quoting(speculation="off")
    assert drafted(off.usage) == (0, 0)  # no drafter: nothing verified, whatever the budget
    drafted(default.usage)  # (the counts are there; how many were verified is the budget's, timing's, call)
    wait_until(lambda: proposed(ngram_daemon) > before, "the default's n-grams proposed")  # the input quoted
    assert_same_greedy_text_up_to_near_tie(chat_result(default.choices[0]), chat_result(off.choices[0]))


@pytest.mark.timeout(300)  # a daemon and 2-4 greedy requests: ~20 s alone, ~75 s on 2 busy cores
def test_ollamas_speculation_option_turns_the_default_off(ngram_daemon: Daemon) -> None:
    """Ollama's replies carry no drafted-token counts: /metrics counts them by dialect."""
    accepted = f'llamactor_accepted_prediction_tokens_total{{dialect="ollama",model="{MODEL_ID}"}}'

    def counted() -> float:
        return metric(httpx.get(f"{ngram_daemon.url}/metrics").text, re.escape(accepted))
    client = ollama.Client(host=ngram_daemon.url)
    client.chat(model=MODEL_ID, messages=QUOTING, options={"temperature": 0, "num_predict": 24, "speculation": "off"})
    assert counted() == 0
    before = proposed(ngram_daemon)
    client.chat(model=MODEL_ID, messages=QUOTING, options={"temperature": 0, "num_predict": 24})
    # (whether the budget verifies the proposals depends on step timings: a loaded host's may not)
    wait_until(lambda: proposed(ngram_daemon) > before, "the default's n-grams proposed")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("prediction, where", [
    ({"type": "file", "content": "x"}, "prediction.type"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]},
     "prediction.content"),
    ({"type": "content", "content": 7}, "prediction.content"),
    ("def add(a, b): ...", "prediction"),
])
def test_a_malformed_prediction_is_a_400_naming_it_before_any_stream_starts(daemon: Daemon, prediction: Any,
                                                                            where: str, stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        daemon.client().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=4,  # type: ignore[call-overload]
                                                prediction=prediction, stream=stream)
    assert refused.value.status_code == 400 and str(refused.value.body["message"]).startswith(where)  # type: ignore[index]
