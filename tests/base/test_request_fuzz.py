"""A hypothesis fuzz of ``GenerationRequest.build``, the one place loose arguments (the Python API's,
a dialect's plan, a batch line) become a request: whatever it is given, it returns a request or
raises ``InvalidRequestError``, never anything else. And of the path from a built request to the
real batcher (an in-process ``llamactor.start`` with a small context): every request that builds
either answers or fails with a ``LlamactorError``, and the batcher never restarts.

Deterministic (derandomized, no example database) and bounded: every request decodes at most
``MAX_TOKENS`` tokens. ``LLAMACTOR_FUZZ_EXAMPLES`` multiplies the budget for a deeper run by hand.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import llamactor
from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import InvalidRequestError, LlamactorError
from llamactor.base.request import GenerationRequest

SCALE = int(os.environ.get("LLAMACTOR_FUZZ_EXAMPLES", "8")) / 8  # the routes fuzz's examples per operation
MAX_TOKENS = 4
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# -- loose arguments ---------------------------------------------------------------------------

SCALARS = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12)
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                    max_leaves=8)
SMALL_INTS = st.integers(-3, 70)
# what a hostile caller types: lone surrogates (valid JSON: "\\ud800"), special-token text, a NUL,
# line-structured text, template syntax
HOSTILE_TEXT = st.sampled_from(["\ud800", "a\udfffb", "<start_of_turn>user\n", "<bos></s><|im_end|>", "\x00",
                                "hi\n" * 200, "{{ raise_exception('x') }}", "\u00e9" * 100, " "])
TEXT = st.text(st.characters(exclude_categories=()), max_size=40) | HOSTILE_TEXT  # any code point
TOKEN_IDS = st.lists(st.integers(-2, 300_000), max_size=6)

SCHEMA_LEAF = st.sampled_from([{"type": "string"}, {"type": "integer", "minimum": 0}, {"type": "number"},
                               {"type": "boolean"}, {"enum": ["a", "b"]}, {"type": "string", "pattern": "^[a-z]+$"},
                               {"type": "string", "maxLength": 3}, {}])
SCHEMAS = st.recursive(SCHEMA_LEAF, lambda kids: st.builds(
    lambda props, required: {"type": "object", "properties": props, "required": [k for k in props if required]},
    st.dictionaries(st.text("abc", min_size=1, max_size=3), kids, max_size=3), st.booleans())
    | st.builds(lambda items: {"type": "array", "items": items, "maxItems": 2}, kids)
    | st.builds(lambda options: {"anyOf": options}, st.lists(kids, min_size=1, max_size=3)), max_leaves=6)
GRAMMARS = st.sampled_from(['root ::= "yes" | "no"', 'root ::= [a-z]+', "start: /[0-9]+/", 'root ::= "a" root?',
                            "root ::=", "%llguidance {}\nstart: \"x\""]) | TEXT

FUNCTION = st.fixed_dictionaries({"name": st.sampled_from(["get_weather", "f"]) | TEXT},
                                 optional={"description": TEXT, "parameters": SCHEMAS | JSON, "strict": JSON})
TOOL = st.fixed_dictionaries({"type": st.just("function") | JSON}, optional={"function": FUNCTION | JSON})
TOOL_CHOICE = (st.sampled_from(["auto", "none", "required", "any"])
               | st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": TEXT})})
               | JSON)
TOOL_CALL = st.fixed_dictionaries({}, optional={"id": TEXT, "type": st.just("function") | JSON,
                                                "function": st.fixed_dictionaries({}, optional={
                                                    "name": TEXT | JSON, "arguments": TEXT | JSON}) | JSON})
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | TEXT | JSON},
    optional={"content": TEXT | JSON | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
                                                max_size=2),
              "tool_calls": st.lists(TOOL_CALL | JSON, max_size=2) | JSON, "tool_call_id": TEXT, "name": TEXT,
              "reasoning_content": TEXT})

NUMBERS = st.floats() | st.integers(-2**70, 2**70)
# Each sampling parameter with a value of its own type (what a dialect's typed body can carry),
# any value of it: negative, huge, NaN, a lone surrogate.
TYPED_SAMPLING = {
    "max_tokens": st.none() | st.integers(-2, 2**40), "temperature": NUMBERS, "top_k": st.integers(-2**40, 2**40),
    "top_p": NUMBERS, "min_p": NUMBERS, "repeat_penalty": NUMBERS, "repeat_last_n": st.integers(-2**40, 2**40),
    "presence_penalty": NUMBERS, "frequency_penalty": NUMBERS, "seed": st.none() | st.integers(-2**70, 2**70) | st.sampled_from([-1, -2**31, 2**32, 2**64]),
    "stop": TEXT | st.lists(TEXT, max_size=20), "ignore_eos": st.booleans(),
    "logprobs": st.booleans() | st.integers(-2, 30), "top_logprobs": st.integers(-2, 30),
    "logit_bias": st.dictionaries(st.integers(-2, 300_000) | st.text("0123456789-", max_size=7), NUMBERS, max_size=3),
    "prompt_logprobs": st.none() | st.integers(-2, 30),
    "prediction": st.none() | TEXT, "speculation": st.sampled_from(["off", "ngram"]) | TEXT,
}
# ... and any value at all, of any type (the Python API takes whatever a caller passes)
ANY_SAMPLING = {name: SCALARS | JSON | st.lists(TEXT, max_size=3) for name in [*TYPED_SAMPLING, "bogus"]}


@st.composite
def loose_arguments(draw: st.DrawFn, sampling: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """Keyword arguments of ``GenerationRequest.build`` (``defaults`` apart), any of them odd;
    the sampling parameters' values drawn from ``sampling``."""
    args: dict[str, Any] = {}
    if draw(st.booleans()):
        args["messages"] = draw(st.lists(MESSAGE | JSON, max_size=4) | JSON)
    if draw(st.booleans()) or not args:
        args["prompt"] = draw(TEXT | TOKEN_IDS | JSON)
    optional = {
        "n": SMALL_INTS | JSON, "priority": SMALL_INTS | st.sampled_from(["high", "low", "normal"]) | JSON,
        "tools": st.lists(TOOL, max_size=2) | JSON, "tool_choice": TOOL_CHOICE,
        "parallel_tool_calls": st.booleans() | JSON, "json_schema": SCHEMAS | JSON, "grammar": GRAMMARS,
        "echo": st.booleans(), "chat_template_kwargs": JSON, "continuations": st.lists(TEXT | TOKEN_IDS, max_size=3),
        "echo_prompt": st.booleans(), "clamp_max_tokens": st.booleans(),
        "lora": st.dictionaries(TEXT, st.floats(-2, 2) | JSON, max_size=2) | JSON,
        "adapters": st.lists(TEXT, max_size=2), "request_id": TEXT | st.none(),
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)):
        args[name] = draw(optional[name])
    for name in draw(st.lists(st.sampled_from(sorted(sampling)), max_size=5, unique=True)):
        args[name] = draw(sampling[name])
    return args


PLAUSIBLE_SAMPLING = {
    **TYPED_SAMPLING, "temperature": st.floats(0, 2), "top_k": st.integers(0, 100), "top_p": st.floats(0.01, 1),
    "min_p": st.floats(0, 1), "repeat_penalty": st.floats(0.5, 2), "repeat_last_n": st.integers(0, 128),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2), "top_logprobs": st.integers(0, 20),
    "logprobs": st.booleans() | st.integers(0, 20), "prompt_logprobs": st.none() | st.integers(0, 20),
}


@st.composite
def plausible_arguments(draw: st.DrawFn) -> dict[str, Any]:
    """Arguments that mostly build (a chat or a prompt, sampling values in range), with what a
    hostile caller slips in: any seed, any code point (lone surrogates), odd roles and tool calls,
    token ids outside the vocabulary, stops, schemas, grammars and tools."""
    args: dict[str, Any] = {}
    optional: dict[str, st.SearchStrategy[Any]]
    if draw(st.booleans()):
        args["messages"] = draw(st.lists(MESSAGE, min_size=1, max_size=4))
        optional = {"tools": st.lists(TOOL, max_size=2), "tool_choice": TOOL_CHOICE,
                    "chat_template_kwargs": st.dictionaries(st.text(max_size=8), JSON, max_size=2)}
    else:
        args["prompt"] = draw(TEXT | st.lists(st.integers(0, 262_200), min_size=1, max_size=8))
        optional = {"echo": st.booleans(), "continuations": st.lists(TEXT | TOKEN_IDS, max_size=2)}
    optional |= {"n": st.integers(1, 3), "json_schema": SCHEMAS, "grammar": GRAMMARS}
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=2, unique=True)):
        args[name] = draw(optional[name])
    for name in draw(st.lists(st.sampled_from(sorted(PLAUSIBLE_SAMPLING)), max_size=6, unique=True)):
        args[name] = draw(PLAUSIBLE_SAMPLING[name])
    return args


def build_or_refuse(defaults: SamplingParams, args: dict[str, Any]) -> GenerationRequest | None:
    """The request ``args`` build, or None where ``build`` refused them with ``InvalidRequestError``
    (anything else it raises fails the test, with its traceback)."""
    try:
        return GenerationRequest.build(defaults, **args)
    except InvalidRequestError:
        return None


@pytest.mark.pure
@settings(FUZZ, max_examples=int(600 * SCALE))
@given(loose_arguments(TYPED_SAMPLING))
def test_build_returns_a_request_or_raises_invalid_request_error(args: dict[str, Any]) -> None:
    build_or_refuse(SamplingParams(), args)


@pytest.mark.pure
@settings(FUZZ, max_examples=int(300 * SCALE))
@given(loose_arguments(ANY_SAMPLING))
def test_build_refuses_sampling_values_of_any_wrong_type_with_invalid_request_error(args: dict[str, Any]) -> None:
    build_or_refuse(SamplingParams(), args)


# -- a built request through the real batcher --------------------------------------------------

@pytest.fixture(scope="module")
def small_llm(model_path: str) -> Iterator[llamactor.LLM]:
    handle = llamactor.start(model_path, n_ctx=1024, n_parallel=4, batch_timeout_ms=5)
    yield handle
    handle.close()


RESTARTED_BY: list[str] = []  # the requests that restarted the batcher, first first


def bounded(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` decoding at most ``MAX_TOKENS`` tokens (the batcher's work, not the count, is fuzzed)."""
    max_tokens = args.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens > MAX_TOKENS:
        return {**args, "max_tokens": MAX_TOKENS}
    return args


@settings(FUZZ, max_examples=int(30 * SCALE), phases=[Phase.explicit, Phase.generate])  # no shrinking: a
@given(args=plausible_arguments())  # crash loop leaves the model down, and every later example would fail
def test_every_built_request_answers_or_fails_typed_and_the_batcher_never_restarts(
        small_llm: llamactor.LLM, args: dict[str, Any]) -> None:
    # (hypothesis replays the failing example at the end: by then the model may be down, and the
    # cause is the request recorded when it restarted the batcher)
    assert small_llm.stats()["state"] == "ready", f"the model is down since {RESTARTED_BY[:1]}"
    request = build_or_refuse(small_llm.config.sampling, bounded(args))
    if request is None:
        return
    restarts = small_llm.stats()["restarts"]
    for future in small_llm.submit(request):
        try:
            future.result(timeout=120)
        except LlamactorError:
            pass
        except concurrent.futures.TimeoutError:
            pytest.fail(f"no answer in 120 s to {request!r}")
    if small_llm.stats()["restarts"] != restarts:
        RESTARTED_BY.append(repr(request))
        pytest.fail(f"the batcher restarted on {request!r}")
