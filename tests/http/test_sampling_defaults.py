"""Through the real daemon: a request that sets no sampling gets the GGUF's recommendation (under
the operator's flags), in the OpenAI and Ollama dialects alike, and ``/api/show`` lists it."""

from __future__ import annotations

from collections.abc import Iterator

import ollama
import pytest

from tests.support.daemon import (API_KEY, Daemon, assert_same_greedy_text_up_to_near_tie, legacy_result, ollama_result,
                                  start_daemon)
from tests.support.gguf_copies import with_sampling

# top_k 1: a request that sets nothing is greedy whatever its seed (llamactor's own top_k is 40)
RECOMMENDED = {"temp": 1.0, "top_k": 1, "min_p": 0.0}
PROMPT = "Once upon a time, in a small village by the sea,"
OPERATOR_MAX_TOKENS = 7


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, instruct_path: str) -> Iterator[Daemon]:
    copy = with_sampling(instruct_path, tmp_path_factory.mktemp("gguf") / "smollm2.gguf", RECOMMENDED)
    d = start_daemon("--model", str(copy), "--n-parallel", "1", "--n-threads", "1", "--n-ctx", "1024",
                     "--max-tokens", str(OPERATOR_MAX_TOKENS), "--api-key", API_KEY)
    yield d
    assert d.stop() == 0


def test_openai_requests_without_sampling_get_the_ggufs(daemon: Daemon) -> None:
    client = daemon.client()
    greedy = client.completions.create(model="m", prompt=PROMPT, temperature=0, max_tokens=10, logprobs=2)
    for seed in (1, 2, 3):  # each as greedy (up to a near-tie: a prompt cached or not may part there)
        seeded = client.completions.create(model="m", prompt=PROMPT, seed=seed, max_tokens=10, logprobs=2)
        assert_same_greedy_text_up_to_near_tie(legacy_result(seeded.choices[0]), legacy_result(greedy.choices[0]))
    # the request's own top_k wins: at temperature 1.5 the seeds part
    parted = {client.completions.create(model="m", prompt=PROMPT, seed=seed, temperature=1.5, max_tokens=10,
                                        extra_body={"top_k": 40}).choices[0].text for seed in (1, 2)}
    assert len(parted) == 2


def test_ollama_generate_without_options_gets_the_ggufs_and_show_lists_them(daemon: Daemon) -> None:
    client = ollama.Client(host=daemon.url, headers={"Authorization": f"Bearer {API_KEY}"})
    greedy = client.generate(model="m", prompt=PROMPT, raw=True, logprobs=True, top_logprobs=2,
                             options={"temperature": 0, "num_predict": 10})
    for seed in (1, 2):
        seeded = client.generate(model="m", prompt=PROMPT, raw=True, logprobs=True, top_logprobs=2,
                                 options={"seed": seed, "num_predict": 10})
        assert_same_greedy_text_up_to_near_tie(ollama_result(seeded), ollama_result(greedy))
    parameters = client.show("m").parameters or ""
    assert "top_k                          1" in parameters.splitlines()
    assert "temperature                    1.0" in parameters.splitlines()


def test_the_operators_max_tokens_bounds_a_request_that_sets_none(daemon: Daemon) -> None:
    client = daemon.client()
    text = client.completions.create(model="m", prompt=PROMPT, extra_body={"ignore_eos": True})
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Tell a long story."}],
                                          extra_body={"ignore_eos": True})
    for answer in (text, chat):  # before: the operator's --max-tokens was ignored, 1,000+ tokens
        assert answer.usage is not None and answer.usage.completion_tokens == OPERATOR_MAX_TOKENS
        assert answer.choices[0].finish_reason == "length"
    longer = client.completions.create(model="m", prompt=PROMPT, max_tokens=9, extra_body={"ignore_eos": True})
    assert longer.usage is not None and longer.usage.completion_tokens == 9  # the request's own limit wins
