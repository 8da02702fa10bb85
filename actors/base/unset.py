"""None means "not set": the one rule for every optional setting (``start()``, ``Config``, a
model entry, a request's sampling values), so a caller can pass its own optional settings
straight through and get the defaults. Pure."""

from __future__ import annotations

import dataclasses
from typing import Any


def set_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` without the ones given as None: in configuration None means "not set", so a
    caller can pass its own optional settings straight through and get the defaults."""
    return {k: v for k, v in options.items() if v is not None}


def fill_unset(obj: Any) -> None:
    """Give each field that holds None although its type takes no None its default: a frozen
    dataclass's ``Config(loras=None)`` means the default, not a TypeError deep in validation."""
    for f in fields_without_none(type(obj)):
        if getattr(obj, f.name) is not None:
            continue
        if f.default is not dataclasses.MISSING:
            object.__setattr__(obj, f.name, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            object.__setattr__(obj, f.name, f.default_factory())


_WITHOUT_NONE: dict[type, tuple[dataclasses.Field[Any], ...]] = {}


def fields_without_none(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The fields whose annotation takes no None (annotations are strings here: PEP 563)."""
    if cls not in _WITHOUT_NONE:
        _WITHOUT_NONE[cls] = tuple(f for f in dataclasses.fields(cls)
                                   if "None" not in str(f.type).replace(" ", "").split("|"))
    return _WITHOUT_NONE[cls]
