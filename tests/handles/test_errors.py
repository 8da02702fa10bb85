"""Bad input and overload end one request with a typed error and leave the others intact."""

from __future__ import annotations

import concurrent.futures

import pytest

import llamactor
from llamactor import (
    BatcherUnavailableError,
    CancelledError,
    InvalidRequestError,
    QueueFullError,
)


def test_an_empty_prompt_is_an_invalid_request(llm: llamactor.LLM) -> None:
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.ask("")
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.ask([])


def test_a_prompt_plus_max_tokens_beyond_the_sequence_context_is_an_invalid_request(llm: llamactor.LLM) -> None:
    with pytest.raises(InvalidRequestError, match="per-sequence context"):
        llm.ask("word " * 5000, max_tokens=8)
    with pytest.raises(InvalidRequestError, match="per-sequence context"):
        llm.ask("hi", max_tokens=llm.info.n_ctx_seq)


def test_bad_and_unknown_sampling_parameters_fail_before_anything_is_queued(llm: llamactor.LLM) -> None:
    with pytest.raises(InvalidRequestError, match="temperature"):
        llm.submit("hi", temperature=-0.5)
    with pytest.raises(InvalidRequestError, match="unknown sampling parameter"):
        llm.submit("hi", temprature=0.5)
    with pytest.raises(InvalidRequestError, match="role"):
        llm.chat([{"role": "wizard", "content": "hi"}])
    assert llm.ask("Still fine?", max_tokens=2).usage.completion_tokens <= 2


def test_a_full_queue_refuses_the_newest_request_and_serves_the_rest(start_llm) -> None:
    llm = start_llm(n_parallel=1, max_queue=2)
    running = iter(llm.stream("Tell me a long story:", max_tokens=60, temperature=0, ignore_eos=True))
    next(running)  # it holds the only seq_id now (kept referenced: dropping the iterator cancels it)
    queued = [llm.submit("a", max_tokens=2), llm.submit("b", max_tokens=2)]
    refused = llm.submit("c", max_tokens=2)
    with pytest.raises(QueueFullError):
        refused.result(timeout=30)
    assert [f.result(timeout=60).usage.completion_tokens for f in queued] == [2, 2]



def test_cancelling_a_request_frees_its_seq_id_and_returns_the_partial_text(start_llm) -> None:
    llm = start_llm(n_parallel=1)
    stream = llm.stream("Count slowly: one, two, three,", max_tokens=200, temperature=0, ignore_eos=True)
    pieces = iter(stream)
    first = next(pieces)
    llm.cancel(stream.request_id)
    with pytest.raises(CancelledError) as caught:
        list(pieces)
    partial = caught.value.completion
    assert partial is not None and partial.finish_reason == "cancelled"
    assert partial.text.startswith(first) and partial.usage.completion_tokens < 200
    assert llm.ask("next", max_tokens=2, ignore_eos=True).usage.completion_tokens == 2
    assert llm.stats()["free_seq_ids"] == 1


def test_cancelling_the_future_or_breaking_out_of_a_stream_frees_the_sequence(start_llm) -> None:
    llm = start_llm(n_parallel=1)
    future = llm.submit("Count: one, two,", max_tokens=300, ignore_eos=True)
    future.cancel()
    for piece in llm.stream("Count: one, two,", max_tokens=300, ignore_eos=True):
        break
    assert llm.ask("next", max_tokens=2, ignore_eos=True).usage.completion_tokens == 2
    assert llm.stats()["free_seq_ids"] == 1


def test_closing_with_requests_in_flight_ends_every_caller_without_hanging(model_path: str) -> None:
    llm = llamactor.start(model_path, n_parallel=2, n_ctx=1024)
    stream = llm.stream("A long tale:", max_tokens=400, ignore_eos=True)
    next(iter(stream))
    futures = [llm.submit(f"tale {i}", max_tokens=400, ignore_eos=True) for i in range(4)]
    llm.close()
    for f in futures:
        with pytest.raises(BatcherUnavailableError):
            f.result(timeout=30)
    with pytest.raises(BatcherUnavailableError):
        llm.submit("after close")
    done, _ = concurrent.futures.wait([stream.future], timeout=30)
    assert done


def test_a_consumer_that_raises_cancels_only_its_own_request(llm: llamactor.LLM) -> None:
    from llamactor.base.messages import Generate, ReplyChannel
    from llamactor.base.sampling import SamplingParams
    import time

    def broken(_piece: object) -> None:
        raise RuntimeError("event loop is closed")

    restarts = llm.stats()["restarts"]
    reply = ReplyChannel(on_piece=broken)
    msg = Generate(request_id="broken-consumer", params=SamplingParams(max_tokens=50, ignore_eos=True), reply=reply,
                   submitted_at=time.perf_counter(), text="Hello")
    llm._supervisor.tell(msg)
    healthy = llm.submit("Hello", max_tokens=5, ignore_eos=True)
    with pytest.raises(concurrent.futures.CancelledError):
        reply.future.result(timeout=30)
    assert healthy.result(timeout=30).usage.completion_tokens == 5
    assert llm.stats()["restarts"] == restarts  # the batcher did not crash


def test_an_unknown_priority_is_an_invalid_request_and_the_others_go_on(llm: llamactor.LLM) -> None:
    with pytest.raises(InvalidRequestError, match="priority must be"):
        llm.submit("x", priority="urgent")
    assert llm.ask("Fine", max_tokens=2, ignore_eos=True, priority="high").usage.completion_tokens == 2
