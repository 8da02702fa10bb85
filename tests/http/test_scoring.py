"""Prompt log-probabilities over HTTP with the official ``openai`` client (echo + logprobs, vLLM's
prompt_logprobs, max_tokens 0), and lm-evaluation-harness's ``local-completions`` run end to end
against ``llamactor serve``. Values are checked against llama-cpp-python (scoring_helpers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.daemon import API_KEY, MODEL_ID, Daemon, start_daemon
from tests.support.scoring import TASK, assert_close_in_a_batch, reference, run_lm_eval  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "8", "--api-key", API_KEY, "--flash-attn", "off")
    yield d
    assert d.stop() == 0


def tokenize(daemon: Daemon, text: str) -> list[int]:
    r = httpx.post(f"{daemon.url}/tokenize", json={"prompt": text, "add_special_tokens": False},
                   headers={"Authorization": f"Bearer {API_KEY}"})
    return list(r.json()["tokens"])


def test_echo_with_logprobs_returns_the_prompt_tokens_logprobs_as_lm_eval_reads_them(
        daemon: Daemon, reference: Any) -> None:
    ids = tokenize(daemon, "Question: What is the capital of France?\nAnswer: Paris")
    c = daemon.client().completions.create(model=MODEL_ID, prompt=ids, echo=True, logprobs=1, max_tokens=1,
                                           temperature=0)
    lp = c.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert c.choices[0].text.startswith("Question: What is the capital of France?\nAnswer: Paris")
    assert_close_in_a_batch(lp.token_logprobs[1:len(ids)], reference.logprobs(ids)[0])
    text = c.choices[0].text
    for token, offset in zip(lp.tokens, lp.text_offset or []):
        assert text[offset:offset + len(token)] == token


def test_a_batch_of_text_prompts_with_max_tokens_zero_echoes_each_prompt_alone(daemon: Daemon) -> None:
    prompts = ["The sky is blue.", "Two plus two is four."]
    c = daemon.client().completions.create(model=MODEL_ID, prompt=prompts, echo=True, logprobs=2, max_tokens=0)
    assert [ch.text for ch in c.choices] == prompts and c.usage.completion_tokens == 0
    for ch in c.choices:
        assert ch.finish_reason == "length" and ch.logprobs is not None and ch.logprobs.top_logprobs is not None
        assert all(len(top) <= 2 for top in ch.logprobs.top_logprobs[1:])
        assert "".join(ch.logprobs.tokens) == ch.text


def test_vllm_prompt_logprobs_come_keyed_by_token_id_with_ranks(daemon: Daemon) -> None:
    ids = tokenize(daemon, "Hello there, general")
    c = daemon.client().completions.create(model=MODEL_ID, prompt=ids, max_tokens=1, temperature=0,
                                           extra_body={"prompt_logprobs": 2})
    entries = (c.choices[0].model_extra or {})["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    for token, entry in zip(ids[1:], entries[1:]):
        assert str(token) in entry and 1 <= len(entry) <= 3
        assert min(e["rank"] for e in entry.values()) == 1


def test_prompt_logprobs_are_refused_where_they_cannot_be_given(daemon: Daemon) -> None:
    client = daemon.client()
    with pytest.raises(openai.BadRequestError, match="/v1/completions"):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"prompt_logprobs": 1})
    with pytest.raises(openai.BadRequestError, match="not streamed"):
        client.completions.create(model=MODEL_ID, prompt="hi", echo=True, logprobs=1, stream=True)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_ID, prompt="hi", logprobs=21)


@pytest.mark.timeout(600)  # lm_eval's own start-up (datasets, pandas) is most of it
def test_lm_eval_local_completions_runs_a_multiple_choice_task_and_matches_llama_cpp_python(
        daemon: Daemon, reference: Any, tmp_path: Path) -> None:
    docs = run_lm_eval(daemon.url, MODEL_ID, API_KEY, tmp_path, num_concurrent=8)
    assert len(docs) == len(TASK.read_text().splitlines())
    got, expected = [], []
    for doc in docs:
        for i, arguments in enumerate(doc["arguments"].values()):
            # lm-eval's own split: the whole text tokenized once, the continuation being what follows
            # the context's tokens (so a merge across the boundary is scored as lm-eval sends it)
            whole = tokenize(daemon, arguments["arg_0"] + arguments["arg_1"])
            n_context = len(tokenize(daemon, arguments["arg_0"]))
            values, _ = reference.logprobs(whole)
            expected.append(sum(values[n_context - 1:]))
            got.append(float(doc["resps"][i][0][0]))
    assert_close_in_a_batch(got, expected)
