"""Every GGUF a test loads passes through here: in the pytest process and in the Python
processes the tests start (their ``sitecustomize`` installs it), ``llama_cpp``'s model loaders
are wrapped so that each load appends one line to the session's ledger, naming who loaded it,
and fails loudly while a test marked ``pure`` runs. The three variables below are set by
``tests/support/pure_marker.py`` and inherited by every child process."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

LEDGER = "LLAMACTOR_TEST_MODEL_LOADS"  # the file each load appends its line to
OWNER = "LLAMACTOR_TEST_OWNER"  # "test <nodeid>" or "fixture <id>": who runs now (a child: who started it)
PURE = "LLAMACTOR_TEST_PURE"  # set while a test marked pure runs: loading a model then fails
LOADERS = ("llama_model_load_from_file", "llama_load_model_from_file", "llama_model_load_from_splits")


class PureTestLoadedAModel(RuntimeError):
    """A test marked ``pure`` (model-free) loaded a model: mark it otherwise or stop loading."""


def guarded(load: Callable[..., Any]) -> Callable[..., Any]:
    """``load`` (one of llama_cpp's model loaders) that first writes who loads what to the ledger."""
    if getattr(load, "guarded", False):
        return load

    @functools.wraps(load)
    def load_guarded(what: Any, *args: Any, **kwargs: Any) -> Any:
        owner = os.environ.get(OWNER, "")
        if ledger := os.environ.get(LEDGER):
            with open(ledger, "a", encoding="utf-8") as f:  # one short line: appends do not interleave
                f.write(json.dumps({"owner": owner, "model": repr(what), "pid": os.getpid()}) + "\n")
        if os.environ.get(PURE):
            raise PureTestLoadedAModel(f"{owner} is marked pure but loaded a model ({what!r})")
        return load(what, *args, **kwargs)

    load_guarded.guarded = True  # type: ignore[attr-defined]
    return load_guarded


def guard(module: ModuleType) -> None:
    """Wrap the loaders of ``llama_cpp`` (the package re-exports those of ``llama_cpp.llama_cpp``)."""
    for target in (module, sys.modules.get(module.__name__ + ".llama_cpp")):
        for name in LOADERS:
            if target is not None and hasattr(target, name):
                setattr(target, name, guarded(getattr(target, name)))


class GuardOnImport(importlib.abc.MetaPathFinder):
    """Guards ``llama_cpp`` as soon as a child process imports it (importing it up front would
    slow every child that never loads a model)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "llama_cpp":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_and_guard(module: ModuleType) -> None:
                exec_module(module)
                guard(module)

            spec.loader.exec_module = exec_and_guard  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Guard ``llama_cpp`` now if it is imported, else when it is."""
    if "llama_cpp" in sys.modules:
        guard(sys.modules["llama_cpp"])
    else:
        sys.meta_path.insert(0, GuardOnImport())
