"""``llamactor.start()``: one model (an ``LLM`` over one actor tree) or several (a ``Router``).

A thin facade over ``llamactor.handles.llm.start_tree`` and ``llamactor.serving.router.Router``;
runs on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

from llamactor.base.config import Config
from llamactor.base.unset import set_options
from llamactor.base.errors import InvalidRequestError
from llamactor.handles.llm import LLM, start_tree
from llamactor.native import invariance
from llamactor.serving.router import Router


@overload
def start(model: str | None = None, *, models: None = None, config: Config | None = None,
          start_timeout_s: float | None = 300.0, **options: Any) -> LLM: ...
@overload
def start(model: None = None, *, models: Sequence[Any], max_loaded: int | None = None,
          start_timeout_s: float | None = 300.0, **options: Any) -> Router: ...


def start(model: str | None = None, *, models: Sequence[Any] | None = None, max_loaded: int | None = None,
          config: Config | None = None, start_timeout_s: float | None = 300.0, **options: Any) -> LLM | Router:
    """Load ``model`` (None: ``$LLAMACTOR_MODEL`` or the default Gemma 3 270M) and start the actors.

    ``options`` are ``Config`` fields (``n_parallel``, ``n_ctx``, ``system_prompt``, ...) and
    default sampling fields (``temperature``, ``max_tokens``, ...). Blocks until the model is
    loaded; raises ``ModelLoadError`` if it cannot be.

    With ``models`` (``ModelSpec``s or dicts: ``name``, ``path``, ``replicas``, ``policy``,
    ``preload``, ``idle_unload_s`` and Config fields), returns a ``Router`` over them; ``options``
    are then defaults for every model, and at most ``max_loaded`` models are loaded at once.
    An option (or ``start_timeout_s``) given as None is not set: its default holds.
    """
    options = set_options(options)
    start_timeout_s = 300.0 if start_timeout_s is None else start_timeout_s
    if models is not None:
        if model is not None or config is not None:
            raise InvalidRequestError("pass either models= or model/config, not both")
        if options.get("batch_invariant") or any(_spec_option(m, "batch_invariant") for m in models):
            invariance.claim_tiled_mm_off()  # before any model of this process loads, or refused
        return Router(models, max_loaded=max_loaded, defaults=options)
    if max_loaded is not None:
        raise InvalidRequestError("max_loaded applies to models=[...]")
    if config is None:
        config = Config.from_kwargs(model=model, **options)
    elif model is not None or options:
        raise InvalidRequestError("pass either config= or model/options, not both")
    if config.batch_invariant:
        invariance.claim_tiled_mm_off()  # a typed error now rather than a failed batcher start
    return start_tree(config, start_timeout_s)


def _spec_option(model: Any, name: str) -> Any:
    """A Config field of a ``ModelSpec`` or of its dict form (Config fields at its top level)."""
    return model.get(name) if isinstance(model, dict) else getattr(getattr(model, "config", None), name, None)
