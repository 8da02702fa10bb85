"""``llamactor serve --frontend-processes 2``: two front-end processes on one socket, through the
official OpenAI SDK -- a tenant's requests per minute counted once whichever serves it (the engine's
buckets: exactly R of R+k succeed, the rest 429 with Retry-After), and a ``previous_response_id``
conversation whose turns land on either, kept per tenant.

Which front end takes a connection is the kernel's choice; a test makes it one of them by stopping
the other (SIGSTOP) while it connects, so each request's front end is known."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.daemon import MODEL_ID, Daemon, start_daemon
from tests.support.keys import write_keys_file

pytestmark = pytest.mark.timeout(300)
ALICE, BOB, LIMITED = "sk-alice-0001", "sk-bob-000002", "sk-limited-03"
LIMIT = 2  # requests per minute: a bucket refills one every 30 s, far longer than the test takes


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    keys = write_keys_file(tmp_path_factory.mktemp("keys"), {
        ALICE: {"tenant": "alice"}, BOB: {"tenant": "bob"},
        LIMITED: {"tenant": "limited", "requests_per_minute": LIMIT}})
    d = start_daemon("--keys", str(keys), "--n-parallel", "2", "--frontend-processes", "2")
    try:
        assert d.wait_for_log(lambda _: len(d.events("frontend_ready")) == 2, timeout=90), d.log_lines[-5:]
        yield d
    finally:
        assert d.stop() == 0


def front_ends(daemon: Daemon) -> list[int]:
    pids = sorted({int(e["pid"]) for e in daemon.events("frontend_started")})
    assert len(pids) == 2 and daemon.process.pid not in pids
    return pids


@contextlib.contextmanager
def only_through(daemon: Daemon, pid: int, key: str) -> Iterator[openai.OpenAI]:
    """A client whose connections front end ``pid`` alone can accept (the others stopped meanwhile)."""
    others = [p for p in front_ends(daemon) if p != pid]
    for other in others:
        os.kill(other, signal.SIGSTOP)
    try:
        with daemon.client(key) as client:  # its own connections, made while only ``pid`` accepts
            yield client
    finally:
        for other in others:
            os.kill(other, signal.SIGCONT)


def hi(client: openai.OpenAI) -> str:
    """One tiny completion; what the tenant has left of its requests (``x-ratelimit-remaining-requests``)."""
    raw = client.completions.with_raw_response.create(model=MODEL_ID, prompt="Hi", max_tokens=1)
    assert raw.parse().usage is not None
    return raw.headers["x-ratelimit-remaining-requests"]


def test_a_tenants_requests_per_minute_are_counted_once_across_front_ends(daemon: Daemon) -> None:
    first, second = front_ends(daemon)
    with only_through(daemon, first, LIMITED) as client:
        assert hi(client) == str(LIMIT - 1)
    refused = []
    with only_through(daemon, second, LIMITED) as client:
        assert hi(client) == "0"  # the other front end's request was counted here too
        for _ in range(2):  # R + k: beyond R, each refused, before anything ran
            with pytest.raises(openai.RateLimitError) as caught:
                hi(client)
            refused.append(caught.value.response)
    assert all(int(r.headers["retry-after"]) >= 1 and r.headers["x-ratelimit-remaining-requests"] == "0"
               for r in refused)
    with only_through(daemon, first, LIMITED) as client, pytest.raises(openai.RateLimitError):
        hi(client)  # and the first front end sees the same empty bucket
    with only_through(daemon, first, ALICE) as client:  # another tenant is not touched
        assert client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=1).usage is not None


def test_a_conversation_continues_on_either_front_end_and_stays_its_tenants(daemon: Daemon) -> None:
    first, second = front_ends(daemon)
    with only_through(daemon, first, ALICE) as client:
        one = client.responses.create(model=MODEL_ID, input="Once upon a time, a fox", max_output_tokens=8,
                                      temperature=0)
    with only_through(daemon, second, ALICE) as client:
        two = client.responses.create(model=MODEL_ID, input="And then?", previous_response_id=one.id,
                                      max_output_tokens=8, temperature=0)
        assert two.previous_response_id == one.id and one.usage is not None and two.usage is not None
        assert two.usage.input_tokens > one.usage.input_tokens + one.usage.output_tokens  # the whole conversation
        assert 0 < two.usage.input_tokens_details.cached_tokens  # ... from the prefix cache
        events = list(client.responses.create(model=MODEL_ID, input="The end?", previous_response_id=two.id,
                                              max_output_tokens=4, temperature=0, stream=True))
        three = events[-1].response
    with only_through(daemon, second, BOB) as client:  # another tenant's ids are not found, on any front end
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(one.id)
        with pytest.raises(openai.NotFoundError) as caught:
            client.responses.create(model=MODEL_ID, input="Hi", previous_response_id=two.id, max_output_tokens=2)
        assert caught.value.code == "previous_response_not_found"
    with only_through(daemon, first, ALICE) as client:
        # the streamed turn was stored before its last event, on the other front end
        assert client.responses.retrieve(three.id).previous_response_id == two.id
        client.responses.delete(one.id)
    with only_through(daemon, second, ALICE) as client:
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(one.id)
        assert client.responses.retrieve(two.id).id == two.id
