"""How one request is decoded: ``SamplingParams``, frozen and validated in ``__post_init__`` (a
bad value fails at construction with a message naming the field, on the caller's thread)."""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any

from llamactor.base.errors import InvalidRequestError, require as _require
from llamactor.base.grammar import Grammar
from llamactor.base.request_checks import check_text
from llamactor.base.stop_scanner import stop_failure
from llamactor.base.unset import fields_without_none, fill_unset


# The sampling fields that are real numbers, checked for type before their ranges.
_REAL_FIELDS = ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request is decoded. ``temperature=0`` is greedy (argmax, no randomness)."""

    max_tokens: int | None = 256  # None: until EOG or the sequence's context is full; 0: the prompt only
    temperature: float = 0.8
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    repeat_penalty: float = 1.0  # 1.0 disables; llama.cpp semantics over the last repeat_last_n
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False  # report each chosen token's log-probability (an int k: also its k alternatives)
    top_logprobs: int = 0  # and this many most likely alternatives at each position (implies logprobs)
    grammar: Grammar | None = None  # what the output must match (JSON Schema, GBNF, Lark, regex)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added to the logits; a dict is accepted
    # Each prompt token's log-probability under the raw distribution given the tokens before it, and
    # this many most likely alternatives (vLLM's prompt_logprobs); None: not computed.
    prompt_logprobs: int | None = None
    # Speculation (docs/architecture.md, *Speculation*): drafted tokens are verified in the batched
    # step and never change the output. ``prediction``: text the answer is expected to repeat
    # (OpenAI's Predicted Outputs), drafted from; ``speculation``: "ngram" drafts from the
    # sequence's own prompt and output (prompt lookup), "off" none (an operator may make "ngram" the
    # default, as any sampling default). A prediction is drafted from whatever ``speculation`` says.
    prediction: str | None = None
    speculation: str = "off"
    # The fields ``replace`` set (the operator's options, a request's values): those the model's
    # own GGUF defaults never override (``llamactor.base.sampling_defaults``).
    given: frozenset[str] = field(default=frozenset(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        fill_unset(self)
        if self.max_tokens == -1:  # llama-server's n_predict and Ollama's num_predict: no limit
            object.__setattr__(self, "max_tokens", None)
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, (list, tuple)) and all(isinstance(s, str) for s in self.stop):
            object.__setattr__(self, "stop", tuple(self.stop))
        else:
            raise InvalidRequestError(f"stop must be a string or a list of strings, got {self.stop!r:.100}")
        for name in _REAL_FIELDS:  # types before ranges: None < 0 would be a TypeError, not the caller's 400
            value = getattr(self, name)
            _require(isinstance(value, (int, float)) and not isinstance(value, bool),
                     f"{name} must be a number, got {value!r:.100}")
        _require(isinstance(self.repeat_last_n, int) and not isinstance(self.repeat_last_n, bool),
                 f"repeat_last_n must be an integer, got {self.repeat_last_n!r:.100}")
        _require(self.max_tokens is None or (isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool)
                                             and self.max_tokens >= 0),
                 f"max_tokens must be an integer >= 0, -1 or None (no limit), got {self.max_tokens!r}")
        _require(0.0 <= self.temperature <= 100.0, f"temperature must be in [0, 100], got {self.temperature}")
        _require(isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be >= 0, got {self.top_k!r}")
        _require(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _require(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        _require(0.0 < self.repeat_penalty <= 10.0, f"repeat_penalty must be in (0, 10], got {self.repeat_penalty}")
        _require(self.repeat_last_n >= 0, f"repeat_last_n must be >= 0, got {self.repeat_last_n}")
        _require(-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        _require(-2.0 <= self.frequency_penalty <= 2.0,
                 f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        object.__setattr__(self, "seed", _seed(self.seed))
        _require(isinstance(self.top_logprobs, int) and 0 <= self.top_logprobs <= 20,
                 f"top_logprobs must be in [0, 20], got {self.top_logprobs!r}")
        if not isinstance(self.logprobs, bool) and isinstance(self.logprobs, int):
            # OpenAI's legacy form: logprobs=k asks for the chosen token and k alternatives
            _require(0 <= self.logprobs <= 20, f"logprobs must be a bool or in [0, 20], got {self.logprobs}")
            object.__setattr__(self, "top_logprobs", max(self.top_logprobs, self.logprobs))
            object.__setattr__(self, "logprobs", True)
        _require(isinstance(self.logprobs, bool), f"logprobs must be a bool or an int, got {self.logprobs!r}")
        _require(self.prompt_logprobs is None or (isinstance(self.prompt_logprobs, int)
                                                  and not isinstance(self.prompt_logprobs, bool)
                                                  and 0 <= self.prompt_logprobs <= 20),
                 f"prompt_logprobs must be None or in [0, 20], got {self.prompt_logprobs!r}")
        if self.top_logprobs and not self.logprobs:
            object.__setattr__(self, "logprobs", True)
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", tuple(sorted(_bias_items(self.logit_bias))))
        _require(isinstance(self.logit_bias, tuple) and len(self.logit_bias) <= 1024
                 and all(isinstance(t, int) and t >= 0 and -100 <= b <= 100 for t, b in self.logit_bias),
                 "logit_bias must map at most 1024 token ids to biases in [-100, 100]")
        _require(self.grammar is None or isinstance(self.grammar, Grammar),
                 "grammar must be a llamactor Grammar (the API also takes GBNF text or json_schema=)")
        _check_stops(self.stop)
        _check_speculation(self.prediction, self.speculation)

    @property
    def has_penalties(self) -> bool:
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def replace(self, **overrides: Any) -> SamplingParams:
        """A copy with ``overrides`` applied; an unknown name is an ``InvalidRequestError``. None
        keeps this value of a field that takes no None (``max_tokens=None`` still means no limit)."""
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self) if f.init}
        _require(not unknown, f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        kept = {f.name for f in fields_without_none(type(self))}
        overrides = {k: v for k, v in overrides.items() if v is not None or k not in kept}
        copy = dataclasses.replace(self, **overrides)
        object.__setattr__(copy, "given", self.given | frozenset(overrides))
        return copy


# Seeds as OpenAI takes them (64-bit integers): a negative one means "a random seed", as
# llama-server's -1 and Ollama's -1 do. llama-server keeps 32 bits (a larger seed wraps around,
# and 0xFFFFFFFF is its random seed); llamactor keeps the whole value for host sampling (numpy's
# generator) and the low 32 bits for in-graph sampling, so 0xFFFFFFFF is an ordinary seed here.
SEED_LIMIT = 2**64
MAX_STOPS = 16
# A stop string's length: OpenAI and llama-server publish no limit, Bedrock takes 1,000. Long
# ones cost little to match (``llamactor.base.stop_scanner``) but delay a stream by their length.
MAX_STOP_CHARS = 256


def _seed(seed: Any) -> int | None:
    """``seed`` checked: None or negative -> None (random); an integer below 2**64 kept."""
    if seed is None:
        return None
    _require(isinstance(seed, numbers.Integral) and not isinstance(seed, bool),
             f"seed must be an integer (negative: random), got {seed!r}")
    _require(seed < SEED_LIMIT, f"seed must be below 2**64 (negative: random), got {seed}")
    return int(seed) if seed >= 0 else None


def _check_stops(stop: tuple[Any, ...]) -> None:
    """At most ``MAX_STOPS`` non-empty strings of at most ``MAX_STOP_CHARS`` characters, valid
    Unicode; their matchers' tables built now, on the caller's thread (cached for the batcher)."""
    _require(len(stop) <= MAX_STOPS and all(isinstance(s, str) and s for s in stop),
             f"stop must be at most {MAX_STOPS} non-empty strings")
    for i, s in enumerate(stop):
        _require(len(s) <= MAX_STOP_CHARS, f"stop[{i}] is {len(s)} characters long: at most {MAX_STOP_CHARS}")
        check_text(s, f"stop[{i}]")
        stop_failure(s)


SPECULATION_MODES = ("off", "ngram")
# A prediction's length: OpenAI takes one as long as the context; tokenized on the prep pool, so the
# cap only bounds what one request makes the host hold (4x the longest context of the bundled models).
MAX_PREDICTION_CHARS = 1 << 20


def _check_speculation(prediction: Any, speculation: Any) -> None:
    """``prediction`` None or valid Unicode of at most ``MAX_PREDICTION_CHARS``; ``speculation``
    one of ``SPECULATION_MODES``."""
    if prediction is not None:
        _require(isinstance(prediction, str), f"prediction must be a string, got {type(prediction).__name__}")
        _require(len(prediction) <= MAX_PREDICTION_CHARS,
                 f"prediction is {len(prediction)} characters long: at most {MAX_PREDICTION_CHARS}")
        check_text(prediction, "prediction")
    _require(speculation in SPECULATION_MODES,
             f"speculation must be one of {', '.join(SPECULATION_MODES)}, got {speculation!r:.100}")


def _bias_items(bias: dict[Any, Any]) -> list[tuple[int, float]]:
    """OpenAI's ``logit_bias`` keys are token ids as strings; values are numbers."""
    try:
        return [(int(k), float(v)) for k, v in bias.items()]
    except (TypeError, ValueError) as e:
        raise InvalidRequestError("logit_bias must map token ids to numbers") from e
