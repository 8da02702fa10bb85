"""Text assembly (UTF-8 across tokens, stop strings) and request / config validation."""

from __future__ import annotations

import pytest

from llamactor.config import Config, SamplingParams
from llamactor.errors import InvalidRequestError
from llamactor.output import TextAssembler


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
    {"temperature": -1}, {"top_p": 0}, {"top_k": -2}, {"max_tokens": 0}, {"min_p": 2}, {"stop": [""]},
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


def test_config_from_kwargs_routes_sampling_names_and_refuses_unknown_options() -> None:
    cfg = Config.from_kwargs(n_parallel=2, temperature=0.0, max_tokens=8)
    assert cfg.n_parallel == 2 and cfg.sampling.temperature == 0.0 and cfg.sampling.max_tokens == 8
    with pytest.raises(InvalidRequestError, match="n_paralel"):
        Config.from_kwargs(n_paralel=2)
