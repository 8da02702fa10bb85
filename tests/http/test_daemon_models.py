"""One daemon serving several models and replicas (``[[models]]`` in TOML, ``--model NAME=PATH``)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from llamactor.cli.serve import model_specs, split_model
from llamactor.http.state import model_status

from tests.support.daemon import Daemon, metric, start_daemon, wait_until

QUESTION = [{"role": "user", "content": "Name a colour of the sea."}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: str) -> Iterator[Daemon]:
    config = tmp_path_factory.mktemp("config") / "models.toml"
    config.write_text(f'''
[[models]]
name = "plain"
path = "{model_path}"
replicas = 2
n_parallel = 2

[[models]]
name = "pirate"
path = "{model_path}"
system_prompt = "Answer like a pirate would."
preload = false
''')
    d = start_daemon("--config", str(config))
    yield d
    d.stop()


def test_two_models_in_one_daemon_answer_under_their_own_names(daemon: Daemon) -> None:
    client = daemon.client(api_key="unused")
    listed = {m.id: m.model_extra["loaded"] for m in client.models.list().data}
    assert listed == {"plain": True, "pirate": False}
    plain = client.chat.completions.create(model="plain", messages=QUESTION, max_tokens=4, temperature=0)
    pirate = client.chat.completions.create(model="pirate", messages=QUESTION, max_tokens=4, temperature=0)
    assert (plain.model, pirate.model) == ("plain", "pirate")
    assert pirate.usage.prompt_tokens > plain.usage.prompt_tokens  # loaded on first use, with its system prompt
    assert {m.id: m.model_extra["loaded"] for m in client.models.list().data} == {"plain": True, "pirate": True}
    vectors = client.embeddings.create(model="pirate", input=["sea", "sky"])
    assert len(vectors.data) == 2 and vectors.model == "pirate"


def test_an_unknown_model_is_a_404_in_openai_shape(daemon: Daemon) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        daemon.client(api_key="unused").chat.completions.create(model="poet", messages=QUESTION, max_tokens=2)
    assert caught.value.body["code"] == "model_not_found" and "'poet' does not exist" in caught.value.body["message"]


def test_health_and_metrics_report_each_model_and_replica(daemon: Daemon) -> None:
    client = daemon.client(api_key="unused")
    routed = r'llamactor_router_requests_total\{model="plain",replica="(\d)"\} (\S+)'
    before = dict(re.findall(routed, httpx.get(f"{daemon.url}/metrics").text))
    for _ in range(4):
        client.completions.create(model="plain", prompt="The sea is", max_tokens=2)
    health = httpx.get(f"{daemon.url}/health").json()
    assert health["status"] == "ready"
    assert [r["replica"] for r in health["models"]["plain"]["replicas"]] == [0, 1]
    for replica in health["models"]["plain"]["replicas"]:  # each names its backend's devices, the CPU at least
        cpu = next(d for d in replica["devices"] if d["type"] == "cpu")
        assert cpu["name"] == "CPU" and cpu["memory_total"] > 0 and cpu["memory_free"] >= 0
    metrics = httpx.get(f"{daemon.url}/metrics").text
    for model, replica in (("plain", 0), ("plain", 1)):
        assert f'llamactor_ready{{model="{model}",replica="{replica}"}} 1.0' in metrics
        assert f'llamactor_router_requests_total{{model="{model}",replica="{replica}"}}' in metrics
    served = {replica: float(n) - float(before.get(replica, 0)) for replica, n in re.findall(routed, metrics)}
    assert set(served) == {"0", "1"} and sum(served.values()) == 4 and min(served.values()) >= 1  # both served
    assert 'llamactor_generated_tokens_total{dialect="openai",model="plain"}' in metrics


def test_n_choices_over_http_reach_one_replica_which_computes_their_prompt_once(daemon: Daemon) -> None:
    def series(name: str, replica: int) -> str:
        return name + r'\{model="plain",replica="' + str(replica) + r'"\}'

    def deltas(name: str, metrics: str) -> list[float]:
        return [metric(metrics, series(name, r)) - metric(before, series(name, r)) for r in (0, 1)]

    before = httpx.get(f"{daemon.url}/metrics").text
    prompt = f"Log entry {uuid.uuid4().hex[:8]}: the lighthouse keeper wrote that the ships"  # not cached (but BOS)
    c = daemon.client(api_key="unused").completions.create(model="plain", prompt=prompt, n=2, max_tokens=3,
                                                           temperature=0.9, seed=1, extra_body={"ignore_eos": True})
    assert [ch.index for ch in c.choices] == [0, 1] and c.usage.completion_tokens == 6
    # once: the prompt beyond the cached tokens the first choice found, and the second's last prompt token
    once = c.usage.prompt_tokens - c.usage.prompt_tokens_details.cached_tokens + 1

    def published() -> str | None:  # the batchers' counters: at most 50 ms old while busy, exact once idle
        metrics = httpx.get(f"{daemon.url}/metrics").text
        return metrics if sum(deltas("llamactor_prompt_tokens_computed_total", metrics)) >= once else None

    metrics = wait_until(published, f"{once} more prompt tokens computed in /metrics")
    computed = deltas("llamactor_prompt_tokens_computed_total", metrics)
    routed = deltas("llamactor_router_requests_total", metrics)
    assert sorted(routed) == [0, 1] and sorted(computed) == [0, once]
    assert routed.index(1) == computed.index(once)  # both choices on the replica the request was routed to


@pytest.mark.pure
def test_model_flags_name_each_model_and_share_the_engine_options(model_path: str) -> None:
    assert split_model(f"chat={model_path}") == ("chat", model_path)
    assert split_model(model_path) == (None, model_path)
    specs = model_specs((f"chat={model_path}", model_path), [], {"n_parallel": 3, "n_batch": 512}, model_name=None,
                        replicas=2, policy="round_robin", idle_unload_s=None)
    assert [(s.name, s.replicas, s.policy, s.config.n_parallel) for s in specs] == [
        ("chat", 2, "round_robin", 3), ("gemma-3-270m-q4_k_m", 2, "round_robin", 3)]
    assert specs[0].config.n_threads >= 1


@pytest.mark.pure
def test_a_model_with_one_replica_restarting_is_degraded_but_still_served() -> None:
    assert model_status({"ready"}) == "ready"
    assert model_status({"ready", "restarting"}) == "degraded"
    assert model_status({"restarting"}) == "restarting"
    assert model_status({"unloaded"}) == model_status(set()) == "unloaded"
