"""``llamactor serve --frontend-processes 1``: the HTTP front end in a process of its own beside the
engine's, through the official OpenAI SDK -- answers and streams as the one-process daemon gives
them, each caller its own, a refusal's 4xx before a stream starts, a disconnect cancelling its
request in the engine, a killed front end started again without the engine reloading, a drain;
tenants' keys, limits and a SIGHUP's reload in the front end."""

from __future__ import annotations

import concurrent.futures
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner

from llamactor.base.config import Config
from llamactor.base.errors import InvalidRequestError
from llamactor.cli.serve import serve
from tests.support.daemon import (
    API_KEY,
    MODEL_ID,
    Daemon,
    assert_same_greedy_text_up_to_near_tie,
    chat_result,
    start_daemon,
    streamed_chat_result,
)
from tests.support.keys import write_keys_file

pytestmark = pytest.mark.timeout(300)
ENDLESS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "4", "--max-queue", "4", "--api-key", API_KEY, "--frontend-processes", "1")
    try:
        assert d.wait_for_log(lambda e: e.get("event") == "frontend_ready", timeout=60), d.log_lines[-5:]
        yield d
    finally:
        assert d.stop() == 0  # SIGTERM drains the front end, then the engine: a clean exit


def frontend_pid(daemon: Daemon) -> int:
    return int(daemon.events("frontend_started")[-1]["pid"])


def ask(client: openai.OpenAI, content: str, **kw: object) -> object:
    return client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": content}],
                                          max_tokens=12, temperature=0, logprobs=True, top_logprobs=2, **kw)  # type: ignore[call-overload]


def test_the_front_end_is_a_process_of_its_own_and_answers_as_the_daemon_does(daemon: Daemon) -> None:
    assert frontend_pid(daemon) not in (daemon.process.pid, os.getpid())
    served = {e["pid"] for e in daemon.events("serving")}
    assert daemon.process.pid in served
    client = daemon.client()
    whole = ask(client, "Name three colors.")
    streamed = ask(client, "Name three colors.", stream=True)
    assert_same_greedy_text_up_to_near_tie(chat_result(whole.choices[0]), streamed_chat_result(streamed))  # type: ignore[attr-defined]
    health = httpx.get(f"{daemon.url}/health", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert health["status"] == "ready" and health["models"][MODEL_ID]["replicas"][0]["status"] == "ready"


def test_concurrent_callers_each_get_their_own_stream(daemon: Daemon) -> None:
    client = daemon.client()
    prompts = [f"Write the number {i} in words." for i in range(6)]
    alone = [streamed_chat_result(ask(client, p, stream=True)) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda p: streamed_chat_result(ask(client, p, stream=True)), prompts))
    for a, b in zip(alone, together, strict=True):
        assert_same_greedy_text_up_to_near_tie(a, b)


def test_a_refused_stream_gets_its_4xx_before_it_starts(daemon: Daemon) -> None:
    client = daemon.client()
    with pytest.raises(openai.BadRequestError) as refused:  # the body's own check, in the front end
        client.chat.completions.create(model=MODEL_ID, messages=[], max_tokens=4, stream=True)
    assert refused.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as too_long:  # refused by the engine's batcher, over the link
        client.completions.create(model=MODEL_ID, prompt="word " * 5000, max_tokens=4, stream=True)
    assert too_long.value.code == "exceed_context_size_error"


def test_a_client_that_disconnects_cancels_its_request_in_the_engine(daemon: Daemon) -> None:
    stream = daemon.client().completions.create(model=MODEL_ID, prompt="An endless story:", max_tokens=3000,
                                                stream=True, extra_body=ENDLESS)
    rid = next(iter(stream)).id
    stream.close()
    assert daemon.wait_for_log(lambda e: e.get("event") == "request_finished" and e.get("request_id") == rid
                               and e.get("finish_reason") == "cancelled")
    finished = next(e for e in daemon.events("request_finished") if e["request_id"] == rid)
    assert finished["n_gen"] < 3000


def test_a_killed_front_end_is_started_again_and_its_requests_cancelled(daemon: Daemon) -> None:
    before = frontend_pid(daemon)
    loads = len(daemon.events("model_loaded"))
    stream = daemon.client().completions.create(model=MODEL_ID, prompt="An endless story:", max_tokens=3000,
                                                stream=True, extra_body=ENDLESS)
    rid = next(iter(stream)).id
    os.kill(before, signal.SIGKILL)
    assert daemon.wait_for_log(lambda e: e.get("event") == "frontend_died" and e.get("pid") == before)
    assert daemon.wait_for_log(lambda e: e.get("event") == "request_finished" and e.get("request_id") == rid
                               and e.get("finish_reason") == "cancelled")
    assert daemon.wait_for_log(lambda e: e.get("event") == "frontend_ready" and e.get("pid") != before), \
        daemon.log_lines[-5:]
    assert frontend_pid(daemon) != before and daemon.process.poll() is None
    answer = daemon.client().completions.create(model=MODEL_ID, prompt="Hello", max_tokens=3, extra_body=ENDLESS)
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    assert len(daemon.events("model_loaded")) == loads  # the engine and its model were untouched



def test_tenants_keys_limits_and_a_sighup_reach_the_front_end(tmp_path: Path) -> None:
    alice, limited, dave = "sk-alice-0001", "sk-limited-05", "sk-dave-000006"
    tables = {alice: {"tenant": "alice"}, limited: {"tenant": "limited", "requests_per_minute": 2}}
    keys_file = write_keys_file(tmp_path, tables)
    d = start_daemon("--keys", str(keys_file), "--n-parallel", "2", "--frontend-processes", "1")
    try:
        assert d.wait_for_log(lambda e: e.get("event") == "frontend_ready", timeout=60)
        for _ in range(2):
            d.client(limited).completions.create(model=MODEL_ID, prompt="Hi", max_tokens=1)
        with pytest.raises(openai.RateLimitError):  # the tenant's requests per minute, counted in the front end
            d.client(limited).completions.create(model=MODEL_ID, prompt="Hi", max_tokens=1)
        with pytest.raises(openai.AuthenticationError):
            d.client(dave).models.list()
        write_keys_file(tmp_path, {**tables, dave: {"tenant": "dave"}})
        d.process.send_signal(signal.SIGHUP)  # to the daemon, which passes it on
        assert d.wait_for_log(lambda e: e.get("event") == "keys_reloaded")
        assert d.client(dave).models.list().data[0].id == MODEL_ID
        assert d.client(alice).completions.create(model=MODEL_ID, prompt="Hi", max_tokens=1).usage is not None
    finally:
        assert d.stop() == 0


@pytest.mark.pure
def test_more_front_end_processes_than_the_cap_are_refused_naming_why() -> None:
    assert Config(frontend_processes=1).frontend_processes == 1 and Config().frontend_processes == 0
    assert Config(frontend_processes=2).frontend_processes == 2 and Config(frontend_processes=64).frontend_processes == 64
    for wrong in (-1, 65):
        with pytest.raises(InvalidRequestError, match=f"frontend_processes must be 0..64, got {wrong}"):
            Config(frontend_processes=wrong)
    result = CliRunner().invoke(serve, ["--frontend-processes", "65"])
    assert result.exit_code == 1 and "frontend_processes must be 0..64, got 65" in result.output
