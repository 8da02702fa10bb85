"""A model's sampling defaults, layered in one place (pure).

A GGUF may carry its author's recommended sampling under ``general.sampling.*`` (llama.cpp's
``gguf`` writer: ``temp``, ``top_k``, ``top_p``, ``min_p``, ``penalty_repeat``, ``penalty_last_n``,
and ``sequence``, ``xtc_*``, ``mirostat*``, which llamactor's samplers do not have). llama.cpp's
``common`` reads them at load and llama-server uses them wherever its operator set no flag. Here
too, per field, highest first: the request's value, the operator's (``Config``: ``start()``
keywords, the TOML file, CLI flags), the GGUF's, a front end's own default (the chat REPL's),
llamactor's built-in ``SamplingParams`` default. A field counts as set by the operator when it
reached ``Config.sampling`` through ``SamplingParams.replace`` (every keyword, TOML key and CLI
flag does) or differs from the built-in default (a ``SamplingParams`` built by hand).

``gguf_sampling`` runs on the batcher thread at load (``llamactor.native.loading``); the rest on
any thread (the handles, the REPL, the HTTP app).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import InvalidRequestError

GGUF_PREFIX = "general.sampling."
# general.sampling.<key> -> the SamplingParams field it sets and the value's type.
GGUF_FIELDS: dict[str, tuple[str, type]] = {
    "temp": ("temperature", float), "top_k": ("top_k", int), "top_p": ("top_p", float),
    "min_p": ("min_p", float), "penalty_repeat": ("repeat_penalty", float),
    "penalty_last_n": ("repeat_last_n", int),
}
# The knobs a user asks about (info, the REPL's /set), in that order.
SHOWN = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
         "frequency_penalty", "max_tokens", "seed")
_BUILT_IN = SamplingParams()


def gguf_sampling(metadata: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The GGUF's sampling defaults as ``SamplingParams`` fields, and the ``general.sampling.*``
    keys left unused, each with why (llamactor has no such sampler, or its value is out of range:
    a model still loads with a bad recommendation, it is just not followed). ``metadata``: as
    llama.cpp prints it (every value as text) or as the GGUF header holds it (typed values)."""
    values: dict[str, Any] = {}
    unused: dict[str, str] = {}
    for key, text in sorted(metadata.items()):
        if not key.startswith(GGUF_PREFIX):
            continue
        name = key.removeprefix(GGUF_PREFIX)
        if name not in GGUF_FIELDS:
            unused[key] = "llamactor has no such sampler"
            continue
        field, kind = GGUF_FIELDS[name]
        try:
            value = _number(text, kind)
            _BUILT_IN.replace(**{field: value})  # its range, checked as a request's would be
        except (TypeError, ValueError, InvalidRequestError) as e:
            unused[key] = f"not a valid {field}: {e}"
            continue
        values[field] = value
    return values, unused


def _number(raw: Any, kind: type) -> int | float:
    """``raw`` (llama.cpp prints a float32 as ``%f``; the header reader gives the float32) as
    ``kind``; ``ValueError`` if it is not one."""
    value = float(raw)
    if not math.isfinite(value) or (kind is int and not value.is_integer()):
        raise ValueError(f"{raw!r}")
    return int(value) if kind is int else round(value, 6)  # float32's digits, not 0.69999998


def operator_set(operator: SamplingParams) -> frozenset[str]:
    """The fields of ``operator`` (a ``Config.sampling``) its operator chose."""
    differing = {f.name for f in dataclasses.fields(operator)
                 if f.init and getattr(operator, f.name) != getattr(_BUILT_IN, f.name)}
    return operator.given | differing


def model_sampling(operator: SamplingParams, gguf: Mapping[str, Any],
                   front_end: Mapping[str, Any] | None = None) -> SamplingParams:
    """The model's defaults: ``operator``'s chosen fields, else the GGUF's, else ``front_end``'s
    (a front end's own defaults, e.g. the chat REPL's), else the built-in ones. A request's
    values go over these (``GenerationRequest.build``)."""
    chosen = operator_set(operator)
    below = {**(front_end or {}), **gguf}
    layered = operator.replace(**{k: v for k, v in below.items() if k not in chosen})
    object.__setattr__(layered, "given", operator.given)  # what the operator set, not the GGUF
    return layered


def sources(operator: SamplingParams, gguf: Mapping[str, Any], front_end: Mapping[str, Any] | None = None,
            front_end_name: str = "front end") -> dict[str, str]:
    """Where each ``SHOWN`` field of ``model_sampling`` comes from: "operator", "model" (the
    GGUF), ``front_end_name`` or "llamactor"."""
    chosen = operator_set(operator)
    return {name: "operator" if name in chosen else "model" if name in gguf
            else front_end_name if name in (front_end or {}) else "llamactor" for name in SHOWN}


def described(params: SamplingParams, where: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``{"temperature": {"value": 0.6, "source": "model"}, ...}``: what ``info`` shows."""
    return {name: {"value": getattr(params, name), "source": where[name]} for name in SHOWN}
