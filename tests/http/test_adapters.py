"""LoRA adapters over HTTP through the official openai client: llama-server's per-request
``lora`` ids (``extra_body``) and ``/lora-adapters``, vLLM's adapter name as the ``model`` (and
``/v1/models`` listing adapters with their parent), and a bad id refused with a 400 before any
stream starts. The daemon serves SmolLM2-135M-Instruct with two adapters written by the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support.adapters import write_lora
from tests.support.daemon import (Daemon, assert_same_greedy_text_up_to_near_tie, chat_result, legacy_result,
                             start_daemon, streamed_legacy_result)

PROMPT = "The capital of France is"
# A chat question SmolLM2 answers differently under the "style" adapter whatever near-tie the cache
# decides: "...is January" without it, "...is " with it. Found by scanning questions (greedy, 8
# tokens): the two part at the 7th token, and every top-2 margin up to and at it is >= 1.9 on both
# sides, above NEAR_TIE. ("What is the capital of France?" was not such a question: both say
# "...is Paris." and the adapter's answer goes on only past a near-tie of 0.58 against the end.)
QUESTION = [{"role": "user", "content": "Name the first month of the year."}]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, instruct_path: str) -> list[Path]:
    folder = tmp_path_factory.mktemp("lora")
    return [write_lora(folder / "style.gguf", instruct_path), write_lora(folder / "other.gguf", instruct_path, seed=1)]


@pytest.fixture(scope="module")
def daemon(instruct_path: str, adapters: list[Path]) -> Iterator[Daemon]:
    d = start_daemon("--model", instruct_path, "--n-parallel", "4", "--lora", f"style={adapters[0]}",
                     "--lora", f"other={adapters[1]}")
    yield d
    assert d.stop() == 0


def complete(client: openai.OpenAI, **kw: Any) -> Any:
    """A greedy completion of PROMPT with its top-2 log-probabilities (for the near-tie rule)."""
    kw.setdefault("model", "any")
    return client.completions.create(prompt=PROMPT, max_tokens=12, temperature=0, logprobs=2, **kw)


def same(a: Any, b: Any) -> None:
    assert_same_greedy_text_up_to_near_tie(legacy_result(a.choices[0]), legacy_result(b.choices[0]))


def first_token(completion: Any) -> str:
    return str(completion.choices[0].logprobs.tokens[0])


def test_lora_adapters_lists_them_in_flag_order_off_by_default(daemon: Daemon, adapters: list[Path]) -> None:
    listed = httpx.get(f"{daemon.url}/lora-adapters").json()
    assert listed == [{"id": 0, "name": "style", "path": str(adapters[0]), "scale": 0.0},
                      {"id": 1, "name": "other", "path": str(adapters[1]), "scale": 0.0}]


def test_v1_models_lists_each_adapter_with_its_parent_model(daemon: Daemon) -> None:
    client = daemon.client()
    models = {m.id: m for m in client.models.list()}
    (parent,) = [name for name, m in models.items() if not getattr(m, "parent", None)]
    assert getattr(models["style"], "parent") == parent and getattr(models["other"], "parent") == parent
    assert client.models.retrieve("style").id == "style"


def test_a_lora_id_and_the_adapters_name_as_model_give_the_same_answer_which_is_not_the_base_models(
        daemon: Daemon) -> None:
    client = daemon.client()
    base = complete(client)
    by_id = complete(client, extra_body={"lora": [{"id": 0, "scale": 1.0}]})
    by_name = complete(client, model="style")
    same(by_id, by_name)  # (the second attached the first's KV: the same up to a near-tie)
    assert_same_greedy_text_up_to_near_tie(legacy_result(by_id.choices[0]),
                                           streamed_legacy_result(complete(client, model="style", stream=True)))
    assert first_token(by_id) != first_token(base)  # " the" under the adapter, " Paris" without
    assert by_name.model == "style"  # vLLM answers with the adapter's name
    same(base, complete(client, extra_body={"lora": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]}))
    assert complete(client, extra_body={"lora": [{"id": 1, "scale": 1.0}]}).choices[0].text != by_id.choices[0].text


def test_a_chat_runs_under_the_adapter_it_names(daemon: Daemon) -> None:
    client = daemon.client()

    def chat(**kw: Any) -> Any:
        reply = client.chat.completions.create(model=kw.pop("model", "any"), messages=QUESTION,  # type: ignore[arg-type]
                                               max_tokens=8, temperature=0, logprobs=True, top_logprobs=2, **kw)
        return reply.choices[0]

    by_id, by_name, base = chat(extra_body={"lora": [{"id": 0, "scale": 1.0}]}), chat(model="style"), chat()
    assert_same_greedy_text_up_to_near_tie(chat_result(by_id), chat_result(by_name))
    assert by_id.message.content != base.message.content


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_lora_id_is_a_400_before_any_stream_starts(daemon: Daemon, stream: bool) -> None:
    client = daemon.client()
    for body in ({"lora": [{"id": 5, "scale": 1.0}]}, {"lora": [{"id": 0, "weight": 1.0}]}):
        with pytest.raises(openai.BadRequestError):
            complete(client, stream=stream, extra_body=body)
    assert complete(client).choices[0].text  # the daemon goes on


def test_the_anthropic_and_ollama_routes_take_an_adapters_name_as_the_model_too(daemon: Daemon) -> None:
    claude = anthropic.Anthropic(base_url=daemon.url, api_key="none", max_retries=0)

    def message(model: str) -> str:
        reply = claude.messages.create(model=model, max_tokens=8, messages=QUESTION,  # type: ignore[arg-type]
                                       extra_body={"temperature": 0})
        return "".join(b.text for b in reply.content if b.type == "text")

    assert message("style") != message("any")
    client = ollama.Client(host=daemon.url)
    styled, base = (client.chat(model=m, messages=QUESTION, options={"temperature": 0, "num_predict": 8})
                    for m in ("style", "any"))
    assert styled.message.content != base.message.content
