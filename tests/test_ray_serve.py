"""``llamactor serve --ray``'s application on a local Ray instance: 2 replicas of the default model.

Slow (Ray starts in ~10 s); skipped where the ``ray`` extra is not installed. CI installs it.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from llamactor.model_specs import ModelSpec

from .daemon_helpers import free_port

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(model_path: str) -> Iterator[str]:
    from ray import serve

    from llamactor.rayserve.app import APP_NAME, build_app

    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    spec = ModelSpec.from_dict({"name": "chat", "path": model_path, "replicas": 2, "n_parallel": 4, "n_ctx": 2048,
                                "batch_timeout_ms": 5})
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
    chat = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert chat.choices[0].message.content and chat.usage.completion_tokens <= 4
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="chat", prompt="The sea is", max_tokens=6, temperature=0, stream=True) if c.choices)
    plain = client.completions.create(model="chat", prompt="The sea is", max_tokens=6, temperature=0)
    assert streamed == plain.choices[0].text
    with pytest.raises(openai.BadRequestError):  # refused by the replica's tree: the same 400 as in-process
        client.completions.create(model="chat", prompt="x", max_tokens=4, temperature=-1)


def test_both_replicas_serve_requests(url: str) -> None:
    client = _client(url)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda i: client.completions.create(
            model="chat", prompt=f"Story {i}:", max_tokens=24, extra_body={"ignore_eos": True}), range(8)))
    assert all(c.usage.completion_tokens == 24 for c in done)
    metrics = httpx.get(f"{url}/metrics", timeout=60).text
    steps = {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines()
             if line.startswith('llamactor_steps_total{model="chat"')}
    assert len(steps) == 2 and all(n > 0 for n in steps.values()), steps


def test_killing_one_replica_loses_no_plain_request(url: str) -> None:
    from ray.util import list_named_actors

    client = _client(url)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(client.completions.create, model="chat", prompt=f"Tale {i}:", max_tokens=96,
                               extra_body={"ignore_eos": True}) for i in range(6)]
        deadline = time.monotonic() + 60
        while not all(r.get("running") for r in _replicas(url)) and time.monotonic() < deadline:
            pass  # until both replicas decode (each /health asks the replicas: no busy spin)
        victim = next(a for a in list_named_actors(all_namespaces=True) if "llamactor-chat" in a["name"])
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
        done = [f.result(timeout=180) for f in futures]
    assert all(c.usage.completion_tokens == 96 for c in done)
