"""LoRA adapters (pure): the ones a model is started with, and the set one request runs under.

A model is started with named adapter files (``Config.loras``: ``NAME=PATH``, in flag order,
llama-server's ids). A request picks some of them, each with a scale: its *adapter set*, an
``AdapterSet`` -- ``(name, scale)`` pairs sorted by name, zero scales left out, so that two
requests asking for the same thing in other words share one set; ``()`` is the base model.
llama.cpp applies adapters to a whole context, so the scheduler decodes one set per step, and
KV computed under one set is another set's wrong KV: ``adapter_scope`` folds the set into the
cache scope that the prefix index and the lower cache tiers key by.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from llamactor.base.errors import InvalidRequestError

AdapterSet = tuple[tuple[str, float], ...]
BASE: AdapterSet = ()
MAX_SCALE = 100.0  # beyond it an adapter drowns the model; a typo more likely than a wish


def parse_loras(value: Any) -> tuple[tuple[str, str], ...]:
    """``Config.loras`` from ``"NAME=PATH"`` strings, ``(name, path)`` pairs or a mapping of
    names to paths (TOML's ``loras = {style = "style.gguf"}``); names unique, without spaces."""
    items = list(value.items()) if isinstance(value, Mapping) else list(value)
    out: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, str):
            name, sep, path = item.partition("=")
            if not sep:
                raise InvalidRequestError(f"loras: {item!r} must be NAME=PATH")
            item = (name.strip(), path.strip())
        if not (isinstance(item, Sequence) and len(item) == 2 and all(isinstance(x, str) and x for x in item)):
            raise InvalidRequestError(f"loras: each adapter must be NAME=PATH or a (name, path) pair, got {item!r}")
        name, path = item
        if any(c.isspace() for c in name) or "=" in name:
            raise InvalidRequestError(f"loras: an adapter name must have no spaces or '=', got {name!r}")
        out.append((name, path))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise InvalidRequestError(f"loras: adapter names must be unique, got {', '.join(names)}")
    return tuple(out)


def adapter_set(lora: Mapping[str, Any] | AdapterSet | None, names: Sequence[str] | None = None) -> AdapterSet:
    """A request's ``lora`` (``{name: scale}``) as its ``AdapterSet``; with ``names`` (the model's
    adapters), a name it lacks is an ``InvalidRequestError`` now, before anything is queued."""
    if not lora:
        return BASE
    items = list(lora.items()) if isinstance(lora, Mapping) else lora
    # anything but a mapping or (name, scale) pairs is the caller's mistake, not a TypeError here
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) \
            or not all(isinstance(i, Sequence) and not isinstance(i, (str, bytes)) and len(i) == 2 for i in items):
        raise InvalidRequestError(f"lora must map adapter names to scales, got a {type(lora).__name__}")
    out: dict[str, float] = {}
    for name, scale in items:
        if not isinstance(name, str) or isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale) or abs(scale) > MAX_SCALE:
            raise InvalidRequestError(f"lora must map adapter names to scales in [-{MAX_SCALE:g}, {MAX_SCALE:g}], "
                                      f"got {name!r}: {scale!r}")
        if names is not None and name not in names:
            known = ", ".join(names) if names else "none: start the model with --lora NAME=PATH"
            raise InvalidRequestError(f"unknown LoRA adapter {name!r} (this model's adapters: {known})")
        out[name] = float(scale)
    return tuple(sorted((n, s) for n, s in out.items() if s != 0.0))


def from_ids(entries: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, float]:
    """llama-server's per-request ``lora``: ``[{"id": i, "scale": s}]``, ids in the order the
    adapters were given at start (``names``); the adapters not listed get scale 0."""
    out: dict[str, float] = {}
    for entry in entries:
        i, scale = entry.get("id"), entry.get("scale", 1.0)
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(names):
            raise InvalidRequestError(f"lora: unknown adapter id {i!r} (ids 0 to {len(names) - 1} are loaded)"
                                      if names else "lora: this model has no LoRA adapters")
        out[names[i]] = scale
    return out


def adapter_scope(scope: str, adapters: AdapterSet) -> str:
    """The cache scope of a request of ``scope`` under ``adapters``: its own for each set."""
    if not adapters:
        return scope
    return scope + "\x00lora:" + ",".join(f"{n}={s!r}" for n, s in adapters)

