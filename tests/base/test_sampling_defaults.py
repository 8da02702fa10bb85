"""The layering of a model's sampling defaults (pure): request > operator > GGUF > front end >
llamactor's built-in defaults, and what a GGUF's ``general.sampling.*`` keys become."""

from __future__ import annotations

import pytest

from llamactor.base.config import Config
from llamactor.base.sampling import SamplingParams
from llamactor.base.request import GenerationRequest
from llamactor.base.sampling_defaults import described, gguf_sampling, model_sampling, operator_set, sources

pytestmark = pytest.mark.pure

# as llama.cpp's llama_model_meta_val_str prints them: float32 with %f, int32 bare
GGUF_TEXT = {"general.sampling.temp": "0.300000", "general.sampling.top_k": "20", "general.sampling.top_p": "0.850000",
             "general.sampling.min_p": "0.100000", "general.sampling.penalty_repeat": "1.100000",
             "general.sampling.penalty_last_n": "32", "general.architecture": "llama"}
GGUF = {"temperature": 0.3, "top_k": 20, "top_p": 0.85, "min_p": 0.1, "repeat_penalty": 1.1, "repeat_last_n": 32}


def test_the_gguf_keys_become_the_sampling_fields_they_name() -> None:
    values, unused = gguf_sampling(GGUF_TEXT)
    assert values == GGUF and unused == {}
    # the header reader's typed float32 values round to the digits a float32 holds
    assert gguf_sampling({"general.sampling.temp": 0.699999988079071})[0] == {"temperature": 0.7}


def test_keys_llamactor_cannot_follow_are_listed_with_why_and_the_rest_still_apply() -> None:
    values, unused = gguf_sampling({"general.sampling.temp": "0.5", "general.sampling.mirostat": "2",
                                    "general.sampling.sequence": "kpt", "general.sampling.top_p": "0.000000",
                                    "general.sampling.penalty_last_n": "-1", "general.sampling.top_k": "4.5",
                                    "general.sampling.min_p": "nan", "general.sampling.temp_typo": "1"})
    assert values == {"temperature": 0.5}
    assert set(unused) == {"general.sampling.mirostat", "general.sampling.sequence", "general.sampling.top_p",
                           "general.sampling.penalty_last_n", "general.sampling.top_k", "general.sampling.min_p",
                           "general.sampling.temp_typo"}
    assert "no such sampler" in unused["general.sampling.mirostat"]
    assert "top_p" in unused["general.sampling.top_p"] and "(0, 1]" in unused["general.sampling.top_p"]


def test_the_gguf_fills_what_the_operator_left_unset() -> None:
    operator = Config.from_kwargs(model="m.gguf", top_k=64, max_tokens=100).sampling
    layered = model_sampling(operator, GGUF)
    assert (layered.temperature, layered.top_p, layered.min_p, layered.repeat_penalty) == (0.3, 0.85, 0.1, 1.1)
    assert (layered.top_k, layered.max_tokens) == (64, 100)  # the operator's win


def test_an_operator_value_equal_to_llamactors_default_still_wins_over_the_gguf() -> None:
    # --temperature 0.8 is llamactor's own default: chosen on purpose, it is the operator's
    operator = Config.from_kwargs(model="m.gguf", temperature=0.8).sampling
    assert operator_set(operator) == {"temperature"}
    assert model_sampling(operator, GGUF).temperature == 0.8
    assert model_sampling(Config(model="m.gguf").sampling, GGUF).temperature == 0.3


def test_a_hand_built_sampling_counts_its_fields_that_differ_from_the_defaults() -> None:
    assert operator_set(SamplingParams(temperature=0.1, top_k=40)) == {"temperature"}
    assert model_sampling(SamplingParams(temperature=0.1), GGUF).temperature == 0.1


def test_the_request_wins_over_the_layered_defaults() -> None:
    defaults = model_sampling(Config.from_kwargs(model="m.gguf", top_k=64).sampling, GGUF)
    request = GenerationRequest.build(defaults, prompt="hi", temperature=0.9, top_k=5)
    assert (request.params.temperature, request.params.top_k, request.params.top_p) == (0.9, 5, 0.85)


def test_a_front_end_default_sits_under_the_gguf_and_over_llamactors() -> None:
    operator = Config.from_kwargs(model="m.gguf", top_p=0.5).sampling
    chat = {"temperature": 0.2, "top_p": 0.9, "min_p": 0.2}
    assert model_sampling(operator, {"temperature": 0.6}, chat).replace().temperature == 0.6  # the GGUF's
    layered = model_sampling(operator, {"temperature": 0.6}, chat)
    assert (layered.top_p, layered.min_p, layered.top_k) == (0.5, 0.2, 40)  # operator, front end, built-in
    assert model_sampling(Config(model="m.gguf").sampling, {}, chat).temperature == 0.2


def test_info_says_where_each_value_comes_from() -> None:
    operator = Config.from_kwargs(model="m.gguf", top_k=64).sampling
    where = sources(operator, {"temperature": 0.3}, {"min_p": 0.2}, front_end_name="chat")
    assert (where["top_k"], where["temperature"], where["min_p"], where["top_p"]) == (
        "operator", "model", "chat", "llamactor")
    shown = described(model_sampling(operator, {"temperature": 0.3}, {"min_p": 0.2}), where)
    assert shown["temperature"] == {"value": 0.3, "source": "model"} and shown["min_p"]["value"] == 0.2


def test_given_is_no_option_and_not_part_of_equality() -> None:
    with pytest.raises(Exception, match="unknown"):
        Config.from_kwargs(model="m.gguf", given=frozenset({"temperature"}))
    assert SamplingParams().replace(temperature=0.8) == SamplingParams()
