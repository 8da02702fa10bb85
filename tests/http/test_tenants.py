"""Tenants over real HTTP with the official clients: keys from a file (401s in each dialect's
shape), each tenant's own prefix cache (a paired check: a repeat is a hit for its tenant and a
miss for another, wherever a dialect reports cached tokens), quotas with their headers, stored
responses per tenant, admin-only metrics, a keys file reloaded on SIGHUP."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support.daemon import MODEL_ID, Daemon, start_daemon
from tests.support.keys import write_keys_file

KEYS = {"alice": "sk-alice-0001", "carol": "sk-carol-0003", "bob": "sk-bob-00002", "ops": "sk-ops-000004",
        "limited": "sk-limited-05"}
KEY_TABLES = {KEYS["alice"]: {"tenant": "alice", "cache_scope": "team"},
              KEYS["carol"]: {"tenant": "carol", "cache_scope": "team"},
              KEYS["bob"]: {"tenant": "bob"}, KEYS["ops"]: {"tenant": "ops", "admin": True},
              KEYS["limited"]: {"tenant": "limited", "requests_per_minute": 2, "tokens_per_minute": 400}}
STORY = ("Once upon a time, in a small harbour town, there lived a clockmaker who repaired the lighthouse "
         "lamp every spring. ")


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_keys_file(tmp_path_factory.mktemp("keys"), KEY_TABLES)


@pytest.fixture(scope="module")
def daemon(keys_file: Path) -> Iterator[Daemon]:
    d = start_daemon("--keys", str(keys_file), "--n-parallel", "4")
    yield d
    assert d.stop() == 0


def chat_cached(daemon: Daemon, who: str, question: str) -> int:
    r = daemon.client(KEYS[who]).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": STORY + question}], max_tokens=2, temperature=0)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return r.usage.prompt_tokens_details.cached_tokens or 0


def test_a_missing_or_unknown_key_is_a_401_in_each_dialects_own_shape(daemon: Daemon) -> None:
    with pytest.raises(openai.AuthenticationError):
        daemon.client("sk-nobody-000").chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.AuthenticationError) as refused:
        anthropic.Anthropic(base_url=daemon.url, api_key="sk-nobody-000", max_retries=0).messages.create(
            model=MODEL_ID, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(ollama.ResponseError) as no_key:
        ollama.Client(host=daemon.url).chat(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}])
    assert no_key.value.status_code == 401
    reply = ollama.Client(host=daemon.url, headers={"Authorization": f"Bearer {KEYS['bob']}"}).chat(
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
    assert reply.done
    assert httpx.get(f"{daemon.url}/").text == "Ollama is running"  # the heartbeat stays open


def test_a_tenants_repeat_hits_its_own_cache_and_another_tenants_identical_prompt_misses(daemon: Daemon) -> None:
    assert chat_cached(daemon, "alice", "Who repaired the lamp?") == 0
    assert chat_cached(daemon, "alice", "Who repaired the lamp?") > 20  # the cache is on: alice's repeat is a hit
    # The very same prompt: bob cannot see alice's entry (at most his own earlier chats' first
    # tokens match: the transcript's "User:" turn marker).
    assert chat_cached(daemon, "bob", "Who repaired the lamp?") < 5
    assert chat_cached(daemon, "bob", "Who repaired the lamp?") > 20  # his own repeat is
    assert chat_cached(daemon, "carol", "Who repaired the lamp?") > 20  # carol shares alice's cache scope


def test_anthropic_and_responses_report_only_the_callers_own_hits(daemon: Daemon) -> None:
    def anthropic_cached(who: str) -> int:
        m = anthropic.Anthropic(base_url=daemon.url, api_key=KEYS[who], max_retries=0).messages.create(
            model=MODEL_ID, max_tokens=2, messages=[{"role": "user", "content": "Anthropic: " + STORY}],
            extra_body={"temperature": 0})
        return m.usage.cache_read_input_tokens or 0

    def responses_cached(who: str) -> int:
        r = daemon.client(KEYS[who]).responses.create(model=MODEL_ID, input="Responses: " + STORY,
                                                      max_output_tokens=2, temperature=0)
        assert r.usage is not None
        return r.usage.input_tokens_details.cached_tokens
    for cached in (anthropic_cached, responses_cached):  # (each its own prompt: nobody has sent it yet)
        assert cached("alice") < 5 and cached("alice") > 20 and cached("bob") < 5, cached.__name__


def test_a_stored_response_is_its_tenants_alone(daemon: Daemon) -> None:
    mine = daemon.client(KEYS["alice"]).responses.create(model=MODEL_ID, input="Hello", max_output_tokens=2)
    bob = daemon.client(KEYS["bob"])
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model=MODEL_ID, input="And then?", previous_response_id=mine.id, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(mine.id)
    assert daemon.client(KEYS["alice"]).responses.retrieve(mine.id).id == mine.id


def test_over_its_quota_a_tenant_gets_429s_with_openais_rate_limit_headers(daemon: Daemon) -> None:
    client = daemon.client(KEYS["limited"])
    first = client.chat.completions.with_raw_response.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert first.headers["x-ratelimit-limit-requests"] == "2" and first.headers["x-ratelimit-remaining-requests"] == "1"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) < 400 and first.headers["x-ratelimit-reset-tokens"]
    client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    headers = refused.value.response.headers
    assert int(headers["retry-after"]) >= 1 and headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.BadRequestError, match="could never run"):  # over a whole minute's tokens
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=500)
    daemon.client(KEYS["bob"]).chat.completions.create(  # another tenant is not limited by it
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def test_metrics_and_the_detailed_health_are_for_admins(daemon: Daemon) -> None:
    assert httpx.get(f"{daemon.url}/metrics").status_code == 401
    assert httpx.get(f"{daemon.url}/metrics", headers={"Authorization": f"Bearer {KEYS['bob']}"}).status_code == 403
    scraped = httpx.get(f"{daemon.url}/metrics", headers={"Authorization": f"Bearer {KEYS['ops']}"})
    assert scraped.status_code == 200 and 'llamactor_tenant_requests_total{tenant="alice"}' in scraped.text
    assert httpx.get(f"{daemon.url}/health").json().keys() == {"status"}
    with pytest.raises(ollama.ResponseError) as refused:  # unloading stops everyone's work: admins only
        ollama.Client(host=daemon.url, headers={"Authorization": f"Bearer {KEYS['bob']}"}).generate(
            model=MODEL_ID, prompt="", keep_alive=0)
    assert refused.value.status_code == 403
    assert "models" in httpx.get(f"{daemon.url}/health", headers={"x-api-key": KEYS["ops"]}).json()
    assert any(line.get("event") == "http_request" and line.get("tenant") == "alice" for line in daemon.log_lines)


def test_sighup_reloads_the_keys_file_without_a_restart(daemon: Daemon, keys_file: Path) -> None:
    dave = "sk-dave-000006"
    with pytest.raises(openai.AuthenticationError):
        daemon.client(dave).models.list()
    write_keys_file(keys_file.parent, {**KEY_TABLES, dave: {"tenant": "dave"}})
    seen = len(daemon.events("keys_reloaded"))
    daemon.process.send_signal(signal.SIGHUP)
    assert daemon.wait_for_log(lambda line: line.get("event") == "keys_reloaded" and len(daemon.events("keys_reloaded")) > seen)
    assert daemon.client(dave).models.list().data[0].id == MODEL_ID
    keys_file.write_text("not toml [[")
    daemon.process.send_signal(signal.SIGHUP)
    assert daemon.wait_for_log(lambda line: line.get("event") == "keys_reload_failed")
    assert daemon.client(dave).models.list().data  # a broken file keeps the keys in force
    write_keys_file(keys_file.parent, KEY_TABLES)
