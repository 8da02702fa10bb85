"""``llamactor serve --ray``'s application on a local Ray instance: 2 replicas of the default model.

Slow (Ray starts in ~10 s); skipped where the ``ray`` extra is not installed. CI installs it.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import httpx
import openai
import pytest

from llamactor.serving.model_specs import ModelSpec

from tests.support.daemon import (
    assert_same_greedy_text_up_to_near_tie,
    free_port,
    legacy_result,
    streamed_legacy_result,
    wait_until,
)

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(model_path: str) -> Iterator[str]:
    from ray import serve

    from llamactor.rayserve.app import APP_NAME, build_app

    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # round_robin: requests (and the stats calls behind /health) alternate between the two replicas
    # whatever Ray's cached queue lengths say (stale from an earlier test, shortest_queue once sent
    # a whole burst to one replica and /health saw only the idle one)
    spec = ModelSpec.from_dict({"name": "chat", "path": model_path, "replicas": 2, "n_parallel": 4, "n_ctx": 2048,
                                "batch_timeout_ms": 5, "policy": "round_robin"})
    serve.run(build_app([spec]), name=APP_NAME, route_prefix="/")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _replicas(url: str) -> list[dict]:
    return httpx.get(f"{url}/health", timeout=60).json()["models"]["chat"]["replicas"]


def test_the_openai_client_gets_answers_from_the_ray_deployment(url: str) -> None:
    client = _client(url)
    assert [m.id for m in client.models.list().data] == ["chat"]
    # greedy: at the default sampling Gemma base may answer "Hi" with its turn marker at once (empty)
    chat = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          temperature=0)
    assert chat.choices[0].message.content and chat.usage.completion_tokens <= 4
    # two greedy decodes of one prompt, maybe on two replicas, maybe one from the cache: equal up to a near-tie
    streamed = streamed_legacy_result(client.completions.create(
        model="chat", prompt="The sea is", max_tokens=6, temperature=0, stream=True, logprobs=2))
    plain = client.completions.create(model="chat", prompt="The sea is", max_tokens=6, temperature=0, logprobs=2)
    assert_same_greedy_text_up_to_near_tie(streamed, legacy_result(plain.choices[0]))
    with pytest.raises(openai.BadRequestError):  # refused by the replica's tree: the same 400 as in-process
        client.completions.create(model="chat", prompt="x", max_tokens=4, temperature=-1)


def test_a_stream_through_the_ingress_carries_the_logprobs_of_its_stop_strings_tokens(url: str) -> None:
    """The replica's last piece has logprobs and no text (the stop string's tokens): passed on."""
    text, steps, finish = streamed_legacy_result(_client(url).completions.create(
        model="chat", prompt="One, two, three, four,", max_tokens=12, temperature=0, stop=[", six"], stream=True,
        logprobs=2))
    joined = "".join(s.token for s in steps)
    assert finish == "stop" and joined.startswith(text) and joined[len(text):].startswith(", six"), (text, joined)


def _steps(url: str) -> dict[str, float]:
    """Each replica's decode steps so far (labels -> count), as /metrics publishes them."""
    metrics = httpx.get(f"{url}/metrics", timeout=60).text
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines()
            if line.startswith('llamactor_steps_total{model="chat"')}


def test_both_replicas_serve_requests(url: str) -> None:
    client = _client(url)
    before = _steps(url)  # the deployment is shared by the module: count only this test's steps
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda i: client.completions.create(
            model="chat", prompt=f"Story {i}:", max_tokens=24, extra_body={"ignore_eos": True}), range(8)))
    assert all(c.usage.completion_tokens == 24 for c in done)

    def both_stepped() -> dict[str, float] | None:  # published stats: at most 50 ms old while busy
        steps = _steps(url)
        return steps if len(steps) == 2 and all(n > before.get(k, 0) for k, n in steps.items()) else None

    wait_until(both_stepped, f"decode steps on both replicas (before: {before})", timeout=30)


def test_killing_one_replica_loses_no_plain_request(url: str) -> None:
    from ray.util import list_named_actors

    client = _client(url)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(client.completions.create, model="chat", prompt=f"Tale {i}:", max_tokens=96,
                               extra_body={"ignore_eos": True}) for i in range(6)]
        # /health reports each replica's published stats (at most 50 ms old while it decodes)
        wait_until(lambda: all(r.get("running") for r in _replicas(url)), "both replicas decoding", timeout=60)
        victim = next(a for a in list_named_actors(all_namespaces=True) if "llamactor-chat" in a["name"])
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
        done = [f.result(timeout=180) for f in futures]
    assert all(c.usage.completion_tokens == 96 for c in done)
