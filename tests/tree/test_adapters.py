"""LoRA adapters per request on the real engine (SmolLM2-135M-Instruct, adapters written by the
test): adapter and base requests batched together each answer as llama-cpp-python does alone
(with ``Llama(lora_path=...)`` for the adapter's), KV never crosses adapter sets in the prefix
cache or the RAM tier, and a bad adapter file is refused at start naming file and reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_cpp import Llama

import llamactor
from llamactor.base.errors import InvalidRequestError, ModelLoadError
from llamactor.base.request import GenerationRequest
from llamactor.native.engine import Engine

from tests.support.adapters import assert_same_up_to_near_tie, greedy_reference, write_lora, write_truncated
from tests.conftest import closing_what_the_test_started, decode_prompt

PROMPTS = ["The capital of France is", "My favourite thing to cook on a Sunday is"]
N_TOKENS = 20


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory, instruct_path: str) -> Path:
    return write_lora(tmp_path_factory.mktemp("lora") / "style.gguf", instruct_path)


@pytest.fixture(scope="module")
def references(instruct_path: str, adapter: Path) -> Iterator[dict[Any, Engine]]:
    """Lone-decode engines for near-tie margins: the base model, and under the adapter at 1 and 0.5."""
    engines: dict[Any, Engine] = {}
    for key in (None, 1.0, 0.5):
        e = Engine(instruct_path, n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=1, n_threads=2,
                   loras=(("style", str(adapter)),))
        e.set_adapters((("style", key),) if key else ())
        engines[key] = e
    yield engines
    for e in engines.values():
        e.close()


@pytest.fixture
def start(instruct_path: str, adapter: Path) -> Iterator[Any]:
    with closing_what_the_test_started() as handles:
        def start(**options: Any) -> llamactor.LLM:
            options.setdefault("n_ctx", 2048)
            handles.append(llamactor.start(instruct_path, loras=[f"style={adapter}"], **options))
            return handles[-1]

        yield start


def prompt_ids(engine: Engine, text: str) -> list[int]:
    return list(engine.tokenizer.tokenize(text, add_special=True))


def test_adapter_and_base_requests_in_one_batch_each_answer_as_llama_cpp_python_alone(
        start: Any, instruct_path: str, adapter: Path, references: dict[Any, Engine]) -> None:
    llm = start(n_parallel=6, batch_size=6, batch_timeout_ms=10_000)  # the six flush together
    prompts = [prompt_ids(references[None], p) for p in PROMPTS]
    scales = (None, 1.0, 0.5)
    futures = {(p, s): llm.submit(prompts[p], max_tokens=N_TOKENS, temperature=0,
                                  lora={"style": s} if s else None)
               for p in range(len(prompts)) for s in scales}
    got = {key: f.result(timeout=120).token_ids for key, f in futures.items()}
    assert llm.stats()["adapter_switches"] >= 2 * N_TOKENS  # the three sets ran side by side, taking turns
    for s in scales:
        kwargs = {"lora_path": str(adapter), "lora_scale": s} if s else {}
        reference = Llama(instruct_path, n_ctx=512, verbose=False, **kwargs)
        for p, prompt in enumerate(prompts):
            want = greedy_reference(reference, prompt, N_TOKENS, references[None].tokenizer.is_eog)
            assert_same_up_to_near_tie(references[s], prompt, got[(p, s)], want)
        reference.close()
    for p in range(len(prompts)):
        assert got[(p, None)] != got[(p, 1.0)], "the adapter changes what the model says"


def test_the_adapters_first_token_has_the_adapters_probability_not_the_base_models(
        start: Any, references: dict[Any, Engine]) -> None:
    llm = start(n_parallel=2)
    prompt = prompt_ids(references[None], PROMPTS[0])
    base, styled = (llm.submit(prompt, max_tokens=1, temperature=0, logprobs=True, lora=lora)
                    for lora in (None, {"style": 1.0}))
    token = styled.result().token_ids[0]
    logprob = styled.result().logprobs[0].logprob  # type: ignore[index]
    assert base.result().token_ids[0] != token
    expected = _logprob(references[1.0], prompt, token)
    assert abs(logprob - expected) < 0.4, (logprob, expected)
    assert abs(_logprob(references[None], prompt, token) - expected) > 0.8  # so the check above tells them apart


def _logprob(engine: Engine, prompt: list[int], token: int) -> float:
    """``token``'s log-probability after ``prompt`` decoded alone on ``engine``."""
    engine.clear()
    engine.prefill(0, prompt[:-1])
    logits = decode_prompt(engine, 0, prompt[-1:], n_past=len(prompt) - 1).astype(np.float64)
    return float(logits[token] - logits.max() - np.log(np.exp(logits - logits.max()).sum()))


LONG = ("A library is a collection of books and other materials kept for people to read, study and borrow. "
        "Most towns have a public library, and schools and universities keep their own. The librarian")


def test_the_prefix_cache_never_attaches_kv_computed_under_another_adapter_set(
        start: Any, references: dict[Any, Engine]) -> None:
    llm = start(n_parallel=2, batch_timeout_ms=0)
    prompt = prompt_ids(references[None], LONG)

    def cached(lora: dict[str, float] | None) -> int:
        return llm.submit(prompt, max_tokens=2, temperature=0, lora=lora).result(timeout=60).usage.cached_tokens

    assert cached(None) == 0
    assert cached({"style": 1.0}) == 0  # the base model's KV of this prompt is in the cache: not for it
    assert cached({"style": 0.5}) == 0  # nor the adapter's at another scale
    assert cached({"style": 1.0}) > len(prompt) // 2  # its own is
    assert cached(None) > len(prompt) // 2
    assert cached({"style": 0.0}) > len(prompt) // 2  # scale 0 is the base model


def test_the_ram_tier_restores_an_entry_only_for_its_own_adapter_set(start: Any, references: dict[Any, Engine]) -> None:
    llm = start(n_parallel=2, batch_timeout_ms=0, prefix_cache_cells=0, cache_ram_mib=64)  # entries go to RAM at once
    prompt = prompt_ids(references[None], LONG)

    def cached(lora: dict[str, float] | None) -> int:
        return llm.submit(prompt, max_tokens=2, temperature=0, lora=lora).result(timeout=60).usage.cached_tokens

    assert cached({"style": 1.0}) == 0
    assert cached(None) == 0  # the adapter's entry is in RAM: not for the base model
    assert cached(None) > len(prompt) // 2  # restored from RAM: its own
    assert cached({"style": 1.0}) > len(prompt) // 2
    assert llm.stats()["cache_ram"]["entries"] >= 1


def test_an_unknown_adapter_is_a_typed_error_before_anything_is_queued_and_from_the_batcher_too(
        start: Any) -> None:
    llm = start(n_parallel=2)
    with pytest.raises(InvalidRequestError, match="unknown LoRA adapter 'other'.*style"):
        llm.ask("Hi", lora={"other": 1.0})
    # built without the model's adapter names (as a remote caller might): the batcher refuses it
    request = GenerationRequest.build(llm.config.sampling, prompt="Hi", lora={"other": 1.0})
    with pytest.raises(InvalidRequestError, match="other"):
        llm.submit(request)[0].result(timeout=30)
    assert llm.ask("Hi", max_tokens=2, lora={"style": 1.0}).text is not None  # the tree goes on


@pytest.mark.parametrize("bad, reason", [
    ("truncated", "llama.cpp refused it"),
    ("gemma3", "made for architecture 'gemma3', but the model is 'llama'"),
    ("model", "not a LoRA adapter"),
    ("missing", "file not found"),
])
def test_a_corrupt_adapter_or_one_for_another_architecture_is_refused_at_start(
        tmp_path: Path, instruct_path: str, adapter: Path, bad: str, reason: str) -> None:
    path = {"truncated": lambda: write_truncated(tmp_path / "cut.gguf", adapter),
            "gemma3": lambda: write_lora(tmp_path / "gemma.gguf", instruct_path, arch="gemma3"),
            "model": lambda: Path(instruct_path),
            "missing": lambda: tmp_path / "nowhere.gguf"}[bad]()
    with closing_what_the_test_started(), pytest.raises(ModelLoadError) as refused:
        llamactor.start(instruct_path, n_ctx=1024, n_parallel=2, loras=[("broken", str(path))])
    assert str(path) in str(refused.value) and reason in str(refused.value)
