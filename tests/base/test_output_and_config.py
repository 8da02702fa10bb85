"""Text assembly (UTF-8 across tokens, stop strings) and request / config validation."""

from __future__ import annotations

import dataclasses

import pytest

import llamactor
from llamactor.base.config import Config, max_sequences
from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import InvalidRequestError, SequenceLimitError
from llamactor.tree.text import TextAssembler

pytestmark = pytest.mark.pure


def test_a_character_split_across_tokens_is_emitted_whole() -> None:
    text = TextAssembler()
    euro = "€".encode()
    assert text.push(b"price: " + euro[:1]) == "price: "
    assert text.push(euro[1:2]) == ""
    assert text.push(euro[2:]) == "€"
    assert text.finish() == ""


def test_a_stop_string_is_never_streamed_even_in_part() -> None:
    text = TextAssembler(stop=("END",))
    pieces = [text.push(b"hello E"), text.push(b"N"), text.push(b"D and more")]
    assert pieces == ["hello ", "", ""]
    assert text.stopped and text.text == "hello "


def test_a_held_back_tail_is_released_when_it_does_not_become_a_stop_string() -> None:
    text = TextAssembler(stop=("END",))
    assert text.push(b"the E") == "the "
    assert text.push(b"gg") == "Egg"
    assert text.push(b" E") == " "
    assert text.finish() == "E"
    assert text.text == "the Egg E"


def test_the_earliest_of_several_stop_strings_wins() -> None:
    text = TextAssembler(stop=("b", "a"))
    text.push(b"xxabc")
    assert text.text == "xx"


@pytest.mark.parametrize("bad", [
    {"temperature": -1}, {"top_p": 0}, {"top_k": -2}, {"max_tokens": -2}, {"min_p": 2}, {"stop": [""]},
    {"repeat_penalty": 0},
])
def test_bad_sampling_values_are_refused_with_a_message_naming_the_field(bad: dict) -> None:
    with pytest.raises(InvalidRequestError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_an_unknown_sampling_parameter_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="unknown sampling parameter.*temprature"):
        SamplingParams().replace(temprature=0.5)


def test_config_refuses_a_token_budget_smaller_than_the_sequence_pool() -> None:
    with pytest.raises(InvalidRequestError, match="n_batch"):
        Config(n_parallel=32, n_batch=16)


def test_a_quantized_kv_cache_without_flash_attention_is_refused_naming_both_settings() -> None:
    assert Config(kv_type="q8_0").flash_attn == "auto" and Config(kv_type="f16", flash_attn="off").kv_type == "f16"
    with pytest.raises(InvalidRequestError, match="kv_type q4_0 needs flash attention"):
        Config(kv_type="q4_0", flash_attn="off")
    with pytest.raises(InvalidRequestError, match="kv_type must be one of f16, q8_0, q4_0"):
        Config(kv_type="q5_1")


def test_the_sequence_id_pool_is_sized_to_the_configuration_unless_given() -> None:
    assert Config(n_parallel=16).seq_ids == 16 + 2 + 32  # running, a system prompt's two, cached prefixes
    assert Config(n_parallel=64).seq_ids == 130 and Config(n_parallel=16, prefix_cache=False).seq_ids == 18
    assert Config(n_parallel=64).seq_ids_within(128) == 128  # cut to a model with sliding-window layers
    assert Config(n_parallel=250).seq_ids == 256 and Config(n_parallel=254, prefix_cache=False).seq_ids == 256
    assert Config(n_parallel=4, n_seq_ids=6).seq_ids == 6
    with pytest.raises(InvalidRequestError, match="n_seq_ids must be in"):
        Config(n_parallel=16, n_seq_ids=17)


def test_the_most_sequences_are_the_models_checked_where_it_is_known() -> None:
    with pytest.raises(InvalidRequestError, match=r"n_parallel must be in \[1, 254\]"):
        Config(n_parallel=255)  # beyond llama.cpp's 256 ids on any model
    wide = Config(n_parallel=200)
    assert max_sequences(sliding_window=False) == 256 and max_sequences(sliding_window=True) == 128
    with pytest.raises(SequenceLimitError, match=r"gemma\.gguf holds at most 128 sequence ids .*shadow id.*"
                       r"n_parallel <= 126 .*asked for n_parallel=200") as e:
        wide.seq_ids_within(128, "gemma.gguf")
    assert e.value.details == {"max_sequences": 128} and isinstance(e.value, llamactor.ModelLoadError)
    with pytest.raises(SequenceLimitError, match="asked for n_seq_ids=130"):
        Config(n_parallel=8, n_seq_ids=130).seq_ids_within(128, "gemma.gguf")
    assert Config(n_parallel=126).seq_ids_within(128) == 128


def test_config_from_kwargs_routes_sampling_names_and_refuses_unknown_options() -> None:
    cfg = Config.from_kwargs(n_parallel=2, temperature=0.0, max_tokens=8)
    assert cfg.n_parallel == 2 and cfg.sampling.temperature == 0.0 and cfg.sampling.max_tokens == 8
    with pytest.raises(InvalidRequestError, match="n_paralel"):
        Config.from_kwargs(n_paralel=2)


def test_best_of_keeps_the_choices_with_the_highest_mean_logprob_in_their_order() -> None:
    from llamactor.base.completion import Completion, Timings, TokenLogprob, Usage
    from llamactor.dialects.openai.replies import best_of

    def choice(name: str, logprobs: list[float]) -> Completion:
        return Completion(name, name, (), "stop", Usage(1, len(logprobs), 0), Timings(0, 0, 0, 0),
                          tuple(TokenLogprob("t", lp) for lp in logprobs))

    done = [choice("a", [-3.0, -1.0]), choice("b", [-0.5]), choice("c", [-1.0, -1.2]), choice("d", [-4.0])]
    assert [c.text for c in best_of(done, 2)] == ["b", "c"]
    assert [c.text for c in best_of(done, 1)] == ["b"]


def test_the_prefix_cache_options_are_validated() -> None:
    assert Config(prefix_cache=False, prefix_cache_cells=0).prefix_cache_cells == 0
    with pytest.raises(InvalidRequestError, match="prefix_cache_cells"):
        Config(prefix_cache_cells=-1)
    with pytest.raises(InvalidRequestError, match="n_parallel"):
        Config(n_parallel=255, n_batch=512)


def test_kept_cells_pay_rent_by_default_unless_flash_attention_is_off_or_batches_are_invariant() -> None:
    assert Config().cell_rent and Config(flash_attn="on").cell_rent
    assert not Config(flash_attn="off").cell_rent  # there a prompt's numbers depend on where its cells lie
    assert Config(flash_attn="off", prefix_cache_rent=True).cell_rent and not Config(prefix_cache_rent=False).cell_rent
    assert not Config(batch_invariant=True, prefix_cache_rent=True).cell_rent


def test_n_gpu_layers_defaults_to_the_build_and_takes_a_count_or_all() -> None:
    assert Config().n_gpu_layers is None  # the engine resolves it: all layers on a GPU build, 0 on a CPU one
    assert Config(n_gpu_layers=-1).n_gpu_layers == -1 and Config(n_gpu_layers=0).n_gpu_layers == 0
    assert Config.from_kwargs(n_gpu_layers=12).n_gpu_layers == 12
    with pytest.raises(InvalidRequestError, match="n_gpu_layers must be >= -1"):
        Config(n_gpu_layers=-2)


def _every_field_none(cls: type) -> dict[str, None]:
    return {f.name: None for f in dataclasses.fields(cls) if f.init}


def test_a_config_with_every_field_none_is_the_default_config() -> None:
    assert Config(**_every_field_none(Config)) == Config()
    assert Config.from_kwargs(**_every_field_none(Config), **_every_field_none(SamplingParams)) == Config()


def test_none_in_sampling_is_the_default_except_max_tokens_where_it_means_no_limit() -> None:
    unset = SamplingParams(**_every_field_none(SamplingParams))
    assert unset == SamplingParams(max_tokens=None)
    assert SamplingParams(max_tokens=-1).max_tokens is None  # llama-server's n_predict -1
    operator = SamplingParams(temperature=0.2, top_k=5, stop=("END",))
    assert operator.replace(temperature=None, top_k=None, stop=None) == operator  # the operator's values hold
    assert operator.replace(max_tokens=None).max_tokens is None


def test_a_configured_max_tokens_of_none_is_not_set_and_minus_one_is_no_limit() -> None:
    assert Config.from_kwargs(max_tokens=None).sampling.max_tokens == SamplingParams().max_tokens == 256
    assert Config.from_kwargs(max_tokens=-1).sampling.max_tokens is None

