"""``llamactor.start``: None for any option means "not set", for one model and for a router."""

from __future__ import annotations

import dataclasses

import llamactor
from llamactor.base.config import Config
from llamactor.base.sampling import SamplingParams
from llamactor.serving.model_specs import SPEC_FIELDS
from tests.conftest import closing_what_the_test_started


def _every_option_none() -> dict[str, None]:
    return {f.name: None for cls in (Config, SamplingParams) for f in dataclasses.fields(cls) if f.init and f.name != "model"}


def test_start_with_none_for_every_option_loads_the_defaults_and_answers(model_path: str) -> None:
    with closing_what_the_test_started() as started:
        llm = llamactor.start(model_path, config=None, models=None, max_loaded=None, start_timeout_s=None,
                              **_every_option_none())
        started.append(llm)
        assert llm.config == Config(model=model_path)
        assert llm.ask("The sky is", max_tokens=3, temperature=0).usage.completion_tokens == 3


def test_a_router_given_none_for_every_key_and_default_loads_its_model(model_path: str) -> None:
    entry = {key: None for key in SPEC_FIELDS if key not in ("name", "path")}
    with closing_what_the_test_started() as started:
        router = llamactor.start(models=[{"name": "m", "path": model_path, **entry, **_every_option_none()}],
                                 max_loaded=None, start_timeout_s=None, **_every_option_none())
        started.append(router)
        assert router.names == ["m"]
        assert router["m"].ask("The sky is", max_tokens=3, temperature=0).usage.completion_tokens == 3


def test_the_smallest_context_starts_and_answers(model_path: str) -> None:
    """n_ctx 64 aborted the process in llama.cpp (GGML_ASSERT on its outputs: the default pool's 72
    ids and shadows over a batch cut to 64); Config cuts n_batch to n_ctx as llama.cpp does."""
    with closing_what_the_test_started() as started:
        llm = llamactor.start(model_path, n_ctx=64, n_parallel=2, n_threads=1)
        started.append(llm)
        assert llm.config.n_batch == 64
        assert llm.ask("The sky is " * 12, max_tokens=3, temperature=0).usage.completion_tokens == 3
