"""The daemon as a real subprocess on loopback, driven by the official openai client."""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.daemon import (
    API_KEY,
    MODEL_ID,
    Daemon,
    assert_same_greedy_text_up_to_near_tie,
    chat_result,
    legacy_result,
    metric,
    start_daemon,
    streamed_chat_result,
    streamed_legacy_result,
    wait_until,
)

REPLICA0 = r'\{model="' + MODEL_ID + r'",replica="0"\}'  # the labels of the only replica
REFUSED = r'llamactor_http_requests_total\{path="/v1/completions",status="429"\}'
GENERATED = r'llamactor_generated_tokens_total\{dialect="openai",model="' + MODEL_ID + r'"\}'


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "8", "--max-queue", "2", "--api-key", API_KEY, "--max-body-bytes", "65536")
    yield d
    assert d.stop() == 0


def test_completions_and_chat_work_through_the_openai_client_streamed_and_not(daemon: Daemon) -> None:
    client = daemon.client()
    # Streamed and not, one greedy prompt is decoded twice (the second time from its cached
    # prefix: another batch shape), so the texts agree up to a near-tie, told by the top-2 logprobs.
    c = client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0,
                                  logprobs=2)
    assert c.choices[0].text and c.usage.completion_tokens == 8 and c.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Say hi"}],
                                          max_tokens=8, temperature=0, seed=3, logprobs=True, top_logprobs=2)
    assert chat.choices[0].message.role == "assistant" and chat.usage.prompt_tokens > 3
    streamed_chat = streamed_chat_result(client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, temperature=0, seed=3,
        stream=True, logprobs=True, top_logprobs=2))
    assert_same_greedy_text_up_to_near_tie(streamed_chat, chat_result(chat.choices[0]))
    streamed = streamed_legacy_result(client.completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True, logprobs=2))
    assert_same_greedy_text_up_to_near_tie(streamed, legacy_result(c.choices[0]))
    several = client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=4, n=3, temperature=0.9, seed=1)
    assert [ch.index for ch in several.choices] == [0, 1, 2]
    texts, reasons = ["", ""], [None, None]
    for ch in client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=4, n=2, temperature=0.9, seed=1,
                                        stream=True, extra_body={"ignore_eos": True}):
        for choice in ch.choices:
            texts[choice.index] += choice.text
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert all(texts) and reasons == ["length", "length"]  # (texts may differ from `several`: other batch shape)
    chat_texts = ["", ""]
    for ch in client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], n=2,
                                             max_tokens=4, temperature=0.9, seed=5, stream=True):
        for choice in ch.choices:
            chat_texts[choice.index] += choice.delta.content or ""
    assert all(chat_texts)
    assert [m.id for m in client.models.list().data] == [MODEL_ID]


def test_logprobs_with_top_alternatives_in_chat_and_legacy_completions(daemon: Daemon) -> None:
    client = daemon.client()
    chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Count to three"}],
                                          max_tokens=4, temperature=0, logprobs=True, top_logprobs=2,
                                          extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens == 4
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in content)  # greedy
    legacy = client.completions.create(model=MODEL_ID, prompt="One, two,", max_tokens=3, temperature=0, logprobs=1,
                                       extra_body={"ignore_eos": True})
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == 3 and all(v <= 0 for v in lp.token_logprobs) and len(lp.top_logprobs[0]) == 1
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == legacy.choices[0].text


def test_the_next_chat_turn_reports_its_cached_prompt_tokens_streamed_and_not(daemon: Daemon) -> None:
    client = daemon.client()
    hits = r'llamactor_prefix_cache_hit_tokens_total' + REPLICA0
    hits_before = metric(httpx.get(f"{daemon.url}/metrics").text, hits)
    history = [{"role": "system", "content": "You are a ship's cook who answers in one short sentence. " * 8},
               {"role": "user", "content": "What is for dinner?"}]
    first = client.chat.completions.create(model=MODEL_ID, messages=history, max_tokens=12, temperature=0)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And for dessert?"}]
    second = client.chat.completions.create(model=MODEL_ID, messages=history, max_tokens=12, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=history, max_tokens=4, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 1
    # the batcher's counters are published stats: at most 50 ms old while busy, exact once idle
    hit = second.usage.prompt_tokens_details.cached_tokens + chunks[-1].usage.prompt_tokens_details.cached_tokens

    def counted() -> str | None:
        metrics = httpx.get(f"{daemon.url}/metrics").text
        return metrics if metric(metrics, hits) - hits_before >= hit else None

    metrics = wait_until(counted, f"{hit} more prefix cache hit tokens in /metrics")
    assert re.search(r'^llamactor_prefix_cache_entries' + REPLICA0 + r' \d', metrics, re.M)


def test_a_batch_of_prompts_in_one_request_returns_every_choice_in_openai_order(daemon: Daemon) -> None:
    client = daemon.client()
    prompts = [f"The number {i} is" for i in range(5)]  # 10 choices: the daemon's 8 sequences + max_queue 2
    r = client.completions.create(model=MODEL_ID, prompt=prompts, max_tokens=4, temperature=0, n=2, logprobs=2,
                                  extra_body={"ignore_eos": True, "metadata": {"k": "v"}, "store": False}, user="someone")
    assert [c.index for c in r.choices] == list(range(10))
    alone = [client.completions.create(model=MODEL_ID, prompt=p, max_tokens=4, temperature=0, logprobs=2,
                                       extra_body={"ignore_eos": True}).choices[0] for p in prompts[:2]]
    # index = prompt_index * n + choice; decoded in a batch of 10 and alone: equal up to a near-tie
    for batched, single in zip([r.choices[0], r.choices[2]], alone, strict=True):
        assert_same_greedy_text_up_to_near_tie(legacy_result(batched), legacy_result(single))
    assert r.usage.completion_tokens == 40
    tokens = client.completions.create(model=MODEL_ID, prompt=[[2, 651, 1717], [2, 651, 4799]], max_tokens=2)
    assert len(tokens.choices) == 2
    streamed = client.completions.create(model=MODEL_ID, prompt=prompts[:3], max_tokens=3, stream=True,
                                         extra_body={"ignore_eos": True})
    assert {ch.choices[0].index for ch in streamed if ch.choices} == {0, 1, 2}


def test_the_model_may_be_left_out_and_max_tokens_too(daemon: Daemon) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.post(f"{daemon.url}/v1/chat/completions", headers=headers, timeout=120,
                   json={"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "stop" and "Paris" in body["choices"][0]["message"]["content"]


def test_best_of_generates_several_and_returns_the_most_likely(daemon: Daemon) -> None:
    client = daemon.client()
    c = client.completions.create(model=MODEL_ID, prompt="The lighthouse keeper", max_tokens=6, temperature=1.0,
                                  best_of=3, n=1, seed=4, extra_body={"ignore_eos": True})
    assert len(c.choices) == 1 and c.choices[0].logprobs is None  # ranked by log-probability, not returned
    assert c.usage.completion_tokens == 18  # all three were generated
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(model=MODEL_ID, prompt="x", max_tokens=2, best_of=1, n=2)


def test_eight_concurrent_streams_all_complete(daemon: Daemon) -> None:
    client = daemon.client()

    def one(i: int) -> tuple[str, str]:
        stream = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": f"Count to {i}"}],
                                                max_tokens=16, temperature=0, stream=True, extra_body={"ignore_eos": True})
        pieces, reason = [], None
        for ch in stream:
            pieces.append(ch.choices[0].delta.content or "")
            reason = ch.choices[0].finish_reason or reason
        return "".join(pieces), reason

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    # a stop is the transcript's next "User:" turn (the default model has no chat template)
    assert all(reason in ("length", "stop") for _, reason in results) and all(text for text, _ in results)


def test_bad_input_gets_openai_style_4xx_errors_never_a_500(daemon: Daemon) -> None:
    client = daemon.client()
    # one model: any name is it, as with llama-server (the 404 of several models: test_daemon_models)
    assert client.completions.create(model="gpt-4", prompt="hi", max_tokens=1).model == MODEL_ID
    no_route = httpx.get(f"{daemon.url}/v1/nope", headers={"Authorization": f"Bearer {API_KEY}"})
    wrong_method = httpx.get(f"{daemon.url}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"})
    assert (no_route.status_code, wrong_method.status_code) == (404, 405)
    assert "message" in no_route.json()["error"] and "message" in wrong_method.json()["error"]
    with pytest.raises(openai.BadRequestError, match="per-sequence context"):
        client.completions.create(model=MODEL_ID, prompt="word " * 4500, max_tokens=10)
    with pytest.raises(openai.BadRequestError, match="per-sequence context"):  # refused before the 200
        client.completions.create(model=MODEL_ID, prompt="word " * 4500, max_tokens=10, stream=True)
    with pytest.raises(openai.BadRequestError, match="per-sequence context"):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "word " * 4500}],
                                       max_tokens=10, stream=True, n=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL_ID, prompt="hi", temperature=7)
    with pytest.raises(openai.BadRequestError, match="temprature"):
        client.completions.create(model=MODEL_ID, prompt="hi", extra_body={"temprature": 1})
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.completions.create(model=MODEL_ID, prompt="")
    with pytest.raises(openai.BadRequestError, match="priority"):
        client.completions.create(model=MODEL_ID, prompt="hi", extra_body={"priority": 5000})
    with pytest.raises(openai.BadRequestError, match="invalid json_schema"):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], stream=True,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": {"type": "objectx"}}})
    with pytest.raises(openai.BadRequestError, match="echo of token-id prompts is not streamed"):
        client.completions.create(model=MODEL_ID, prompt=[1, 2, 3], echo=True, stream=True)
    with pytest.raises(openai.AuthenticationError):
        daemon.client(api_key="wrong").completions.create(model=MODEL_ID, prompt="hi")
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    bad_json = httpx.post(f"{daemon.url}/v1/completions", content=b"{not json", headers=headers)
    assert bad_json.status_code == 400 and bad_json.json()["error"]["type"] == "invalid_request_error"
    too_big = httpx.post(f"{daemon.url}/v1/completions", content=b"x" * 70000, headers=headers)
    assert too_big.status_code == 413 and "error" in too_big.json()
    chunked = httpx.post(f"{daemon.url}/v1/completions", content=iter([b"x" * 40000, b"y" * 40000]), headers=headers)
    assert chunked.status_code == 413  # no Content-Length: counted while reading
    assert "Traceback" not in bad_json.text + too_big.text


def test_a_full_queue_answers_429_with_retry_after_and_a_disconnect_cancels_its_request(daemon: Daemon) -> None:
    client = daemon.client()
    refused_before = metric(httpx.get(f"{daemon.url}/metrics").text, REFUSED)
    streams = [client.completions.create(model=MODEL_ID, prompt=f"Long story {i}:", max_tokens=400, stream=True,
                                         extra_body={"ignore_eos": True}) for i in range(8)]
    stream_ids = [next(iter(s)).id for s in streams]  # all eight sequences are running now
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(client.completions.create, model=MODEL_ID, prompt="q", max_tokens=2) for _ in range(2)]
        # /health's pending is the published stats, refreshed every 50 ms while the batcher decodes
        wait_until(lambda: httpx.get(f"{daemon.url}/health").json()["pending"] >= 2, "two requests in the queue")
        r = httpx.post(f"{daemon.url}/v1/completions", json={"model": MODEL_ID, "prompt": "one too many", "max_tokens": 2},
                       headers={"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        streamed = httpx.post(f"{daemon.url}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                              json={"model": MODEL_ID, "prompt": "one too many", "max_tokens": 2, "stream": True})
        assert streamed.status_code == 429 and streamed.json()["error"]["code"] == "queue_full"
        for s in streams:
            s.close()  # disconnect: the daemon must cancel these and free their sequences
        assert all(f.result(timeout=60).usage.completion_tokens == 2 for f in waiting)
    for rid in stream_ids:
        assert daemon.wait_for_log(lambda e, rid=rid: e.get("event") == "request_finished"
                                   and e.get("request_id") == rid and e.get("finish_reason") == "cancelled"), rid
    # idle again: the published stats are exact once the batcher has freed the cancelled sequences
    idle = re.compile("^llamactor_running_sequences" + REPLICA0 + r" 0\.0$", re.M)
    wait_until(lambda: idle.search(httpx.get(f"{daemon.url}/metrics").text), "0 running sequences in /metrics")
    assert metric(httpx.get(f"{daemon.url}/metrics").text, REFUSED) - refused_before == 2


def test_health_and_metrics_report_what_was_done(daemon: Daemon) -> None:
    # The daemon is shared by the module: compare the counters before and after this test's own request.
    assert httpx.get(f"{daemon.url}/health").status_code == 200
    before = httpx.get(f"{daemon.url}/metrics").text
    urgent = daemon.client().completions.create(model=MODEL_ID, prompt="urgent", max_tokens=1,
                                                extra_body={"priority": "high"})
    assert daemon.wait_for_log(lambda e: e.get("event") == "request_finished" and e.get("request_id") == urgent.id
                               and e.get("priority") == 0 and e.get("n_preempted") == 0)
    metrics = httpx.get(f"{daemon.url}/metrics").text
    # counted before the response went out: no wait needed
    assert metric(metrics, GENERATED) - metric(before, GENERATED) == urgent.usage.completion_tokens == 1
    assert "llamactor_time_to_first_token_seconds_bucket" in metrics and "llamactor_kv_cache_usage_ratio" in metrics
    for counter in ("llamactor_preemptions_total", "llamactor_watchdog_trips_total",
                    "llamactor_overlap_steps_planned_ahead_total"):  # a CPU engine steps serially: 0
        assert re.search("^" + counter + REPLICA0 + r" \d", metrics, re.M), counter
        assert metric(metrics, counter + REPLICA0) == metric(before, counter + REPLICA0), counter
    lines = daemon.events("http_request")
    assert lines and {"method", "path", "status", "request_id", "ms"} <= set(lines[-1])


def test_a_non_streaming_client_that_disconnects_cancels_its_request(daemon: Daemon) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{daemon.url}/v1/completions", timeout=httpx.Timeout(60, read=1.0),
                   json={"model": MODEL_ID, "prompt": "An endless story:", "max_tokens": 3000, "ignore_eos": True},
                   headers={"Authorization": f"Bearer {API_KEY}", "X-Request-Id": "abandoned-1"})
    assert daemon.wait_for_log(lambda e: e.get("client_request_id") == "abandoned-1")  # logged once it ended
    rid = next(e for e in daemon.events("http_request") if e.get("client_request_id") == "abandoned-1")["request_id"]
    assert daemon.wait_for_log(lambda e: e.get("event") == "request_finished" and e["request_id"] == f"cmpl-{rid}")
    finished = next(e for e in daemon.events("request_finished") if e["request_id"] == f"cmpl-{rid}")
    assert finished["finish_reason"] == "cancelled" and finished["n_gen"] < 3000


def test_a_streamed_completion_sends_its_usage_in_a_last_chunk_of_its_own_as_openai_does(daemon: Daemon) -> None:
    client = daemon.client()
    ask = dict(model=MODEL_ID, prompt="Once upon a time", max_tokens=4, stream=True, extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(**ask, stream_options={"include_usage": True}))  # type: ignore[call-overload]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert chunks[-2].choices[0].finish_reason == "length" and all(c.usage is None for c in chunks[:-1])
    assert all(c.usage is None for c in client.completions.create(**ask))  # type: ignore[call-overload]
