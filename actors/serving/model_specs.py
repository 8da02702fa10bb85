"""What a router serves: ``ModelSpec``, one named model with its replicas and routing.

As ``[[models]]`` tables of ``llamactor serve --config`` (a top-level ``max_loaded = 2`` goes
with them), or as dicts with the same keys to ``llamactor.start(models=[...])``:

    [[models]]
    name = "chat"
    path = "/models/gemma-3-270m-q4_k_m.gguf"   # or omitted: the default model
    replicas = 2
    policy = "prefix_affinity"    # shortest_queue | round_robin | prefix_affinity
    n_parallel = 8                # any Config field: n_ctx, system_prompt, temperature ...
    loras = ["style=/adapters/style.gguf"]   # LoRA adapters of this model (requests pick them by name)
    [[models]]
    name = "embed"
    path = "/models/embedder.gguf"
    preload = false               # loaded on first use
    idle_unload_s = 600           # and unloaded after ten idle minutes
    # pin = true                  # loaded at start, never unloaded (max_loaded, idle_unload_s)
    autoscaling = {min_replicas = 1, max_replicas = 4, target_ongoing_requests = 16}  # under Ray Serve

Any other key is refused (``InvalidRequestError`` naming the model and the key): a typo such as
``n_paralel`` must not silently leave the default in place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from llamactor.base.config import Config, default_n_threads
from llamactor.base.sampling import SamplingParams
from llamactor.base.unset import fill_unset, set_options
from llamactor.base.errors import InvalidRequestError, ModelNotFoundError
from llamactor.serving.routing import POLICIES

SPEC_FIELDS = ("name", "path", "model", "replicas", "policy", "imbalance_threshold", "preload", "idle_unload_s",
               "autoscaling", "pin")
# Every key a model entry may have: its own, and any Config or sampling field (``model`` is
# ``path``'s other name).
MODEL_KEYS = frozenset(SPEC_FIELDS) | {f.name for cls in (Config, SamplingParams) for f in dataclasses.fields(cls)
                                      if f.init}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model under a router: ``replicas`` actor trees built from ``config``, routed by ``policy``."""

    name: str
    config: Config
    replicas: int = 1
    policy: str = "shortest_queue"
    imbalance_threshold: int = 4  # prefix_affinity: in-flight spread beyond which the shortest queue wins
    preload: bool = True  # load when the router starts (False: on the first request)
    idle_unload_s: float | None = None  # unload after this long without requests; None: never
    autoscaling: Mapping[str, Any] | None = None  # Ray Serve only: its autoscaling_config (instead of replicas)
    pin: bool = False  # loaded at start whatever preload says, and never unloaded by max_loaded or idle time

    def __post_init__(self) -> None:
        fill_unset(self)
        if not isinstance(self.name, str) or not self.name or any(c.isspace() for c in self.name):
            raise InvalidRequestError(f"a model name must be a non-empty string without spaces, got {self.name!r}")
        if not isinstance(self.replicas, int) or not 1 <= self.replicas <= 64:
            raise InvalidRequestError(f"model {self.name!r}: replicas must be in [1, 64], got {self.replicas!r}")
        if self.policy not in POLICIES:
            raise InvalidRequestError(f"model {self.name!r}: policy must be one of {', '.join(POLICIES)}, "
                                      f"got {self.policy!r}")
        if self.imbalance_threshold < 0:
            raise InvalidRequestError(f"model {self.name!r}: imbalance_threshold must be >= 0")
        if self.idle_unload_s is not None and self.idle_unload_s <= 0:
            raise InvalidRequestError(f"model {self.name!r}: idle_unload_s must be > 0 (or absent: never)")

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> ModelSpec:
        """A spec from a ``[[models]]`` table or a ``start(models=[...])`` dict: the keys of
        ``SPEC_FIELDS`` and any ``Config`` or sampling field; ``defaults`` are Config options
        every model gets unless it sets them. Without ``n_threads``, replicas split the cores."""
        if not isinstance(entry, Mapping):
            raise InvalidRequestError(f"a model entry must be a table/dict, got {entry!r}")
        entry = set_options(dict(entry))  # a key given as None is not set
        if "name" not in entry:
            raise InvalidRequestError(f"a model entry needs a name: {entry!r}")
        if "path" in entry and "model" in entry:
            raise InvalidRequestError(f"model {entry['name']!r}: give path or model, not both")
        # Refused here, naming the model, rather than as Config's "unknown option(s)" later.
        if unknown := sorted(set(entry) - MODEL_KEYS, key=str):
            raise InvalidRequestError(f"model {entry['name']!r}: unknown key(s) {', '.join(map(repr, unknown))} "
                                      f"(known: {', '.join(sorted(MODEL_KEYS))})")
        spec = {k: entry.pop(k) for k in SPEC_FIELDS if k in entry}
        path = spec.pop("path", spec.pop("model", None))
        options = {**set_options(dict(defaults or {})), **entry}
        replicas = spec.get("replicas", 1)
        if "n_threads" not in options and isinstance(replicas, int) and replicas >= 1:
            options["n_threads"] = max(1, default_n_threads() // replicas)
        try:
            config = Config.from_kwargs(model=path, **options)
        except InvalidRequestError as e:
            raise InvalidRequestError(f"model {spec.get('name')!r}: {e}") from e
        return cls(config=config, **spec)


def specs_from(models: Sequence[ModelSpec | Mapping[str, Any]], defaults: Mapping[str, Any] | None = None,
               ) -> list[ModelSpec]:
    """Specs from ``ModelSpec``s or dicts; names must be unique and there must be at least one."""
    specs = [m if isinstance(m, ModelSpec) else ModelSpec.from_dict(m, defaults) for m in models]
    if not specs:
        raise InvalidRequestError("models must name at least one model")
    names = [s.name for s in specs]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise InvalidRequestError(f"model names must be unique: {', '.join(duplicated)}")
    return specs


M = TypeVar("M")


def model_named(models: Mapping[str, M], name: str | None) -> M:
    """The model called ``name`` (None: the first) among a router's, or ``ModelNotFoundError``
    naming the ones served (the in-process router, a front-end process's and Ray's ingress's)."""
    if name is None:
        return next(iter(models.values()))
    try:
        return models[name]
    except KeyError:
        raise ModelNotFoundError.among(name, list(models)) from None
