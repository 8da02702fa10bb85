"""Tenants share the queue, the quotas and the models, against ``llamactor serve --keys`` on the real
model with the official clients: one tenant's big request cannot fill the queue for the others
(its own next one is refused, saying whose share is full), a request of more sequences than the
server takes is a 400, the tokenizer routes and Anthropic's ``count_tokens`` are under the
tenant's requests per minute, a stream whose caller walked away is charged the tokens it got,
and a tenant's request does not load a model unless the operator allows it. One daemon for the
module: ``main`` (one sequence at a time, ``max_queue`` 6), ``cold`` and ``open`` not loaded
(``open`` loads on any tenant's request). The rule on its numbers: tests/scheduling/test_queue_shares.py."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.support.daemon import Daemon, start_daemon
from tests.support.keys import write_keys_file

KEYS = {"alice": "sk-alice-0001", "bob": "sk-bob-00002", "ops": "sk-ops-000003", "limited": "sk-limited-04",
        "counter": "sk-counter-05", "metered": "sk-metered-06", "batcher": "sk-batcher-07",
        "walker": "sk-walker-08"}
TOKENS_PER_MINUTE = 240
KEY_TABLES = {KEYS[tenant]: {"tenant": tenant, **table} for tenant, table in {
    "alice": {}, "bob": {}, "ops": {"admin": True}, "limited": {"requests_per_minute": 2},
    "counter": {"requests_per_minute": 1}, "metered": {"tokens_per_minute": TOKENS_PER_MINUTE},
    "batcher": {"requests_per_minute": 6, "max_batch_jobs": 1, "max_files": 2, "max_file_bytes": 4096},
    "walker": {"tokens_per_minute": 600}}.items()}
LONG = {"max_tokens": 1500, "extra_body": {"ignore_eos": True}}  # runs until cancelled


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: str) -> Iterator[Daemon]:
    where = tmp_path_factory.mktemp("shares")
    keys = write_keys_file(where, KEY_TABLES)
    (where / "models.toml").write_text(f'''
[[models]]
name = "main"
path = "{model_path}"
n_parallel = 1
max_queue = 6
max_sequences_per_request = 8

[[models]]
name = "cold"
path = "{model_path}"
preload = false

[[models]]
name = "open"
path = "{model_path}"
preload = false
load_on_request = "tenants"

[[models]]
name = "broken"
path = "{where / 'broken.gguf'}"
preload = false
load_on_request = "tenants"

[[models]]
name = "crowded"
path = "{model_path}"
preload = false
load_on_request = "tenants"
n_parallel = 127
''')
    (where / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 64)  # a header that says GGUF, then nothing
    d = start_daemon("--config", str(where / "models.toml"), "--keys", str(keys))
    yield d
    assert d.stop() == 0


def status(daemon: Daemon, model: str) -> str:
    health = httpx.get(f"{daemon.url}/health", headers={"Authorization": f"Bearer {KEYS['ops']}"})  # an admin's view
    return health.json()["models"][model]["status"]  # type: ignore[no-any-return]


def test_a_tenants_big_request_leaves_room_for_another_and_its_next_one_is_refused_saying_why(daemon: Daemon) -> None:
    alice, bob = daemon.client(KEYS["alice"]), daemon.client(KEYS["bob"])
    with contextlib.ExitStack() as open_streams:
        # 7 sequences: one runs, 6 wait -- alice, alone, may hold the whole queue
        open_streams.enter_context(alice.completions.create(
            model="main", prompt=[f"Count to {i}:" for i in range(7)], stream=True, **LONG))
        with pytest.raises(openai.RateLimitError) as alone:
            alice.completions.create(model="main", prompt="One more", max_tokens=1)
        assert "tenant 'alice' already has 6 sequences waiting" in alone.value.message
        assert "its share of the queue (6: max_queue=6)" in alone.value.message
        # bob still gets in (before: "6 requests already wait for a free sequence", a 429 for all)
        open_streams.enter_context(bob.completions.create(model="main", prompt="Bob's turn", stream=True, **LONG))
        with pytest.raises(openai.RateLimitError) as shared:
            alice.chat.completions.create(model="main", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        assert "(3: max_queue=6 split by weight between the 2 tenants waiting)" in shared.value.message


def test_a_request_of_more_sequences_than_the_server_takes_is_a_400_saying_so(daemon: Daemon) -> None:
    alice = daemon.client(KEYS["alice"])
    for too_many in (lambda: alice.completions.create(model="main", prompt=["a", "b", "c"], n=3, max_tokens=1),
                     lambda: alice.chat.completions.create(model="main", n=9, max_tokens=1,
                                                           messages=[{"role": "user", "content": "hi"}])):
        with pytest.raises(openai.BadRequestError) as refused:
            too_many()
        assert "asks for 9 sequences (n x prompts)" in refused.value.message
        assert "at most 8 per request (max_sequences_per_request)" in refused.value.message
    with pytest.raises(openai.BadRequestError) as never:  # 8: within the cap, but 1 runs and 6 queue at most
        alice.completions.create(model="main", prompt=[str(i) for i in range(8)], max_tokens=1)
    assert "could never be queued whole" in never.value.message


def test_the_tokenizer_routes_and_count_tokens_are_under_the_tenants_requests_per_minute(daemon: Daemon) -> None:
    headers = {"Authorization": f"Bearer {KEYS['limited']}"}
    for _ in range(2):
        ok = httpx.post(f"{daemon.url}/tokenize", json={"model": "main", "content": "Hello there"}, headers=headers)
        assert ok.status_code == 200 and ok.json()["tokens"]
    assert ok.headers["x-ratelimit-remaining-requests"] == "0"
    for path, body in (("/tokenize", {"model": "main", "content": "Hello"}),
                       ("/detokenize", {"model": "main", "tokens": [1, 2]}),
                       ("/apply-template", {"model": "main", "messages": [{"role": "user", "content": "hi"}]})):
        over = httpx.post(f"{daemon.url}{path}", json=body, headers=headers)
        assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limit_exceeded", path
        assert "tenant 'limited' is over its rate limit" in over.json()["error"]["message"]

    counter = anthropic.Anthropic(base_url=daemon.url, api_key=KEYS["counter"], max_retries=0)
    question = [{"role": "user", "content": "How many tokens is this?"}]
    assert counter.messages.count_tokens(model="main", messages=question).input_tokens > 0  # type: ignore[arg-type]
    with pytest.raises(anthropic.RateLimitError):
        counter.messages.count_tokens(model="main", messages=question)  # type: ignore[arg-type]


def test_a_stream_whose_caller_walked_away_is_charged_what_it_streamed(daemon: Daemon) -> None:
    metered = daemon.client(KEYS["metered"])
    # 400 CJK characters: ~400 tokens, estimated (characters / 4) at 100, so the request (with its
    # max_tokens) is reserved 200 of the 240 a minute, and what it really costs is more than 240.
    prompt = "".join(chr(0x4E00 + (i * 37) % 2000) for i in range(400))
    with metered.completions.create(model="main", prompt=prompt, stream=True, max_tokens=100,
                                    extra_body={"ignore_eos": True}) as stream:
        for received, _ in enumerate(stream, 1):
            if received == 3:
                break  # walk away
    assert daemon.wait_for_log(lambda line: line.get("event") == "request_finished"
                               and line.get("tenant") == "metered" and line.get("finish_reason") == "cancelled")
    # request_finished is written before the batcher fails the caller's future, which settles the
    # charge: the next request must wait for the settlement itself.
    assert daemon.wait_for_log(lambda line: line.get("event") == "rate_limit_settled" and line.get("tenant") == "metered")
    finished = [line for line in daemon.events("request_finished") if line.get("tenant") == "metered"][-1]
    assert finished["n_prompt"] + finished["n_gen"] > TOKENS_PER_MINUTE + 100, finished
    # Refunded (before), the tenant would be back at the top; charged, it owes more than a minute's worth.
    with pytest.raises(openai.RateLimitError) as owing:
        metered.completions.create(model="main", prompt="hi", max_tokens=1)
    assert "tenant 'metered' is over its rate limit" in owing.value.message


def test_a_request_whose_caller_walked_away_before_its_answer_is_charged_what_it_computed(daemon: Daemon) -> None:
    # 1600 CJK characters: ~1600 tokens, estimated at 400 (with max_tokens, the minute's 600)
    prompt = "".join(chr(0x4E00 + (i * 37) % 2000) for i in range(1600))
    with pytest.raises(httpx.TimeoutException):  # the client gives up while the prompt is computed
        httpx.post(f"{daemon.url}/v1/completions", timeout=2, headers={"Authorization": f"Bearer {KEYS['walker']}"},
                   json={"model": "main", "prompt": prompt, "max_tokens": 200, "ignore_eos": True})
    assert daemon.wait_for_log(lambda line: line.get("event") == "rate_limit_settled"
                               and line.get("tenant") == "walker", timeout=60)
    with pytest.raises(openai.RateLimitError) as owing:  # before: refunded, as if it had cost nothing
        daemon.client(KEYS["walker"]).completions.create(model="main", prompt="hi", max_tokens=1)
    assert "tenant 'walker' is over its rate limit" in owing.value.message


def test_a_tenants_request_does_not_load_a_model_unless_the_operator_allows_it(daemon: Daemon) -> None:
    bob = daemon.client(KEYS["bob"])
    with pytest.raises(openai.InternalServerError) as refused:
        bob.chat.completions.create(model="cold", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert refused.value.status_code == 503 and "model 'cold' is not loaded" in refused.value.message
    tokenize = httpx.post(f"{daemon.url}/tokenize", json={"model": "cold", "content": "hi"},
                          headers={"Authorization": f"Bearer {KEYS['bob']}"})
    assert tokenize.status_code == 503 and tokenize.json()["error"]["code"] == "model_not_loaded"
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                       "body": {"model": "cold", "prompt": "hi", "max_tokens": 1}}).encode() + b"\n"
    job = bob.batches.create(input_file_id=upload(bob, line), endpoint="/v1/completions", completion_window="24h")
    assert daemon.wait_for_log(lambda ln: ln.get("event") == "job_failed" and ln.get("batch_id") == job.id)
    failed = bob.batches.retrieve(job.id)
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data is not None
    assert failed.errors.data[0].code == "model_not_loaded"
    assert status(daemon, "cold") == "unloaded"  # before: loaded by bob's request (or job), evicting at will

    answer = bob.completions.create(model="open", prompt="The sea is", max_tokens=2)  # load_on_request = tenants
    assert answer.usage is not None and answer.usage.completion_tokens == 2 and status(daemon, "open") == "ready"


def test_a_model_that_fails_to_load_names_its_path_to_admins_and_its_file_alone_to_tenants(daemon: Daemon) -> None:
    with pytest.raises(openai.InternalServerError) as tenant:
        daemon.client(KEYS["bob"]).completions.create(model="broken", prompt="hi", max_tokens=1)
    assert "model 'broken' could not be loaded from broken.gguf" in tenant.value.message
    assert "/broken.gguf" not in tenant.value.response.text  # before: the server's folders, twice
    with pytest.raises(openai.InternalServerError) as admin:
        daemon.client(KEYS["ops"]).completions.create(model="broken", prompt="hi", max_tokens=1)
    assert "could not be loaded from /" in admin.value.message and "/broken.gguf" in admin.value.message


def test_a_model_asking_for_more_sequences_than_it_holds_is_refused_with_its_own_code_and_limit(
        daemon: Daemon) -> None:
    """Gemma holds 128 sequence ids (126 parallel): the typed error, not a model_load_error around it."""
    for who in ("bob", "ops"):  # a tenant, and an admin
        with pytest.raises(openai.InternalServerError) as refused:
            daemon.client(KEYS[who]).completions.create(model="crowded", prompt="hi", max_tokens=1)
        error = refused.value.body
        assert isinstance(error, dict) and error["code"] == "sequence_limit" and error["max_sequences"] == 128
        assert error["model"] == "crowded" and ("path" in error) == (who == "ops")
        assert "holds at most 128 sequence ids" in error["message"] and "n_parallel=127" in error["message"]


def upload(client: openai.OpenAI, data: bytes) -> str:
    return client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id


def test_batch_jobs_run_under_their_owners_quotas_and_limits(daemon: Daemon) -> None:
    batcher = daemon.client(KEYS["batcher"])
    for _ in range(6):  # the minute's requests, spent on the tokenizer
        assert httpx.post(f"{daemon.url}/tokenize", json={"model": "main", "content": "hi"},
                          headers={"Authorization": f"Bearer {KEYS['batcher']}"}).status_code == 200
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                       "body": {"model": "main", "prompt": "The sea is", "max_tokens": 1}}).encode() + b"\n"
    batch = batcher.batches.create(input_file_id=upload(batcher, line), endpoint="/v1/completions",
                                   completion_window="24h")
    with pytest.raises(openai.RateLimitError) as busy:  # one job at a time (before: any number, a thread each)
        batcher.batches.create(input_file_id=upload(batcher, line), endpoint="/v1/completions", completion_window="24h")
    assert "already has 1 batch jobs not finished, its limit (max_batch_jobs=1)" in busy.value.message
    with pytest.raises(openai.BadRequestError) as many:  # two files kept already: the input and the one above
        upload(batcher, line)
    assert "already keeps 2 files, its limit (max_files=2)" in many.value.message
    batcher.files.delete([f.id for f in batcher.files.list() if f.id != batch.input_file_id][0])
    with pytest.raises(openai.BadRequestError) as big:
        upload(batcher, line * 200)
    assert "exceed its limit (max_file_bytes=4096)" in big.value.message

    # its one line waits for the minute's requests to refill (before: it ran outside them), then runs
    assert daemon.wait_for_log(lambda ln: ln.get("event") == "job_waits_for_rate_limit"
                               and ln.get("batch_id") == batch.id and ln.get("tenant") == "batcher")
    assert daemon.wait_for_log(lambda ln: ln.get("event") == "job_finished" and ln.get("batch_id") == batch.id, 60)
    done = batcher.batches.retrieve(batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 0)
