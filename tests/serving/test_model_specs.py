"""Model entries of a router (``ModelSpec``): what a ``[[models]]`` table or a dict may say."""

from __future__ import annotations

import pytest

from llamactor.base.config import Config
from llamactor.serving.model_specs import MODEL_KEYS, ModelSpec

pytestmark = pytest.mark.pure


def test_a_model_entry_with_every_key_none_gets_the_defaults() -> None:
    keys = {k: None for k in MODEL_KEYS if k != "name"}
    spec = ModelSpec.from_dict({"name": "m", **keys}, defaults={"n_ctx": None, "temperature": None})
    assert spec == ModelSpec.from_dict({"name": "m"})
    assert ModelSpec(name="m", config=Config(), replicas=None, policy=None, preload=None) == spec  # type: ignore[arg-type]
