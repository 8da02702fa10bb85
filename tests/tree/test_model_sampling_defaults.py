"""A GGUF's own sampling recommendation (``general.sampling.*``) is the model's default, under the
operator's options and the request's values, on both bundled models: each copied once with the
keys added, as a model author's converter writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamactor.dialects.ollama.models import show_body
from llamactor.base.config import Config
from llamactor.native.gguf_header import read_gguf
from tests.support.gguf_copies import with_sampling

# top_k 1 makes every default request greedy over the penalized logits, whatever its seed: a
# default that took effect shows as seed-independent text (llamactor's own top_k is 40).
RECOMMENDED = {"temp": 0.6, "top_k": 1, "top_p": 0.9, "min_p": 0.1, "penalty_repeat": 1.2, "penalty_last_n": 16,
               "mirostat": 2}
AS_FIELDS = {"temperature": 0.6, "top_k": 1, "top_p": 0.9, "min_p": 0.1, "repeat_penalty": 1.2, "repeat_last_n": 16}
PROMPT = "Once upon a time, in a small village by the sea,"
SEEDS = (11, 12, 13)
N_TOKENS = 10
# One sequence and no prefix cache: every request's logits are computed alike, so equal seeds
# and equal sampling give equal tokens exactly (no near-ties between batch shapes).
ALONE = {"n_parallel": 1, "prefix_cache": False, "n_threads": 1}


@pytest.fixture(scope="session", params=["base", "instruct"])
def recommending(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_path: str,
                 instruct_path: str) -> str:
    """Each bundled model with RECOMMENDED in its GGUF, written once."""
    source = model_path if request.param == "base" else instruct_path
    return str(with_sampling(source, tmp_path_factory.mktemp("gguf") / Path(source).name, RECOMMENDED))


def _ids(llm, seed: int, **sampling: object) -> tuple[int, ...]:
    return llm.ask(PROMPT, seed=seed, max_tokens=N_TOKENS, ignore_eos=True, **sampling).token_ids


def test_the_gguf_sampling_is_the_default_of_requests_that_set_none(start_llm, recommending: str) -> None:
    llm = start_llm(model=recommending, **ALONE)
    assert llm.info.gguf_sampling == AS_FIELDS
    assert "no such sampler" in llm.info.gguf_sampling_unused["general.sampling.mirostat"]
    defaults = llm.sampling_defaults()
    assert {k: getattr(defaults, k) for k in AS_FIELDS} == AS_FIELDS
    by_default = [_ids(llm, seed) for seed in SEEDS]
    assert by_default == [_ids(llm, seed, **AS_FIELDS) for seed in SEEDS]  # the same sampling, to the token
    assert len(set(by_default)) == 1  # top_k 1 from the GGUF: seed-independent
    # a request's own values win: at llamactor's top_k the seeds part
    assert len({_ids(llm, seed, top_k=40, temperature=1.5, min_p=0.0) for seed in SEEDS[:2]}) == 2


def test_the_operators_options_win_over_the_gguf(start_llm, recommending: str) -> None:
    # temperature 0.8 is llamactor's own default too: set on purpose, it is still the operator's
    llm = start_llm(model=recommending, temperature=0.8, top_k=40, **ALONE)
    defaults = llm.sampling_defaults()
    assert (defaults.temperature, defaults.top_k, defaults.min_p, defaults.repeat_penalty) == (0.8, 40, 0.1, 1.2)
    by_default = [_ids(llm, seed) for seed in SEEDS[:2]]
    assert by_default == [_ids(llm, seed, **{**AS_FIELDS, "temperature": 0.8, "top_k": 40}) for seed in SEEDS[:2]]


@pytest.mark.pure
def test_ollama_show_lists_the_sampling_a_request_gets(recommending: str) -> None:
    gguf = read_gguf(recommending)
    assert gguf is not None
    shown = show_body("m", Config(model=recommending), gguf)["parameters"].splitlines()
    assert "temperature                    0.6" in shown and "top_k                          1" in shown
    operator = show_body("m", Config.from_kwargs(model=recommending, top_k=7), gguf)["parameters"]
    assert "top_k                          7" in operator.splitlines()
