"""A folder of models, model-free: the scan (which files are models), the status map, the
``max_loaded`` eviction decision (property-tested over random loads), the serve options."""

from __future__ import annotations

import random
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner

from llamactor.base.errors import InvalidRequestError
from llamactor.cli.commands import main
from llamactor.cli.serve import model_specs
from llamactor.serving.model_dir import ADAPTER, MODEL, PROJECTOR, classify, scan_models_dir
from llamactor.serving.model_status import LOADED, LOADING, UNLOADED, Resident, StatusMap, evictions

from tests.support.model_dir import model_folder, write_gguf

pytestmark = pytest.mark.pure
SPEC_OPTIONS = {"model_name": None, "replicas": 1, "policy": "shortest_queue", "idle_unload_s": None}


@pytest.fixture
def folder(tmp_path: Path, model_path: str, instruct_path: str) -> Path:
    return model_folder(tmp_path / "models", model_path, instruct_path)


def test_every_gguf_is_a_model_named_by_its_stem_but_adapters_and_projectors(folder: Path) -> None:
    write_gguf(folder / "vision.gguf", "clip")  # a projector by its architecture
    write_gguf(folder / "projector.gguf", "llama", gguf.GGUFType.MMPROJ)  # and by its general.type
    found = scan_models_dir(str(folder))
    assert [m.name for m in found.models] == ["broken", "gemma", "smol"]  # sorted; the unreadable one too
    assert {m.name: m.kind for m in found.skipped} == {"lora-smol": ADAPTER, "mmproj-smol": PROJECTOR,
                                                       "projector": PROJECTOR, "vision": PROJECTOR}
    smol = found.models[2]
    assert smol.size == Path(smol.path).stat().st_size > 90_000_000 and found.path_of("smol") == smol.path


def test_the_kind_of_a_file_comes_from_its_header_then_its_name() -> None:
    assert classify("x.gguf", {"general.type": "adapter"}) == ADAPTER
    assert classify("x.gguf", {"general.type": "mmproj"}) == PROJECTOR
    assert classify("x.gguf", {"general.architecture": "clip"}) == PROJECTOR
    assert classify("model-MMPROJ-f16.gguf", None) == PROJECTOR
    assert classify("x.gguf", {"general.type": "model", "general.architecture": "llama"}) == MODEL
    assert classify("x.gguf", None) == MODEL  # unreadable: it fails to load, with its reason


def test_a_missing_folder_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="not a directory"):
        scan_models_dir(str(tmp_path / "nowhere"))


def test_the_status_map_follows_the_lifecycle_and_keeps_the_last_failure() -> None:
    statuses = StatusMap(["a", "b"])
    assert statuses["a"].to_dict() == {"value": UNLOADED}
    assert statuses.loading("a").value == LOADING
    assert statuses.loaded("a").to_dict() == {"value": LOADED} and statuses["a"].loads == 1
    statuses.loading("b")
    failed = statuses.failed("b", "broken.gguf: not a GGUF file")
    assert failed.to_dict() == {"value": UNLOADED, "failed": True, "error": "broken.gguf: not a GGUF file"}
    statuses.loading("b")
    assert statuses.loaded("b").error is None  # a later success clears the failure
    assert statuses.unloaded("a").value == UNLOADED and statuses.unloaded("a").value == UNLOADED
    for impossible in (lambda: statuses.loaded("a"), lambda: statuses.loading("b"), lambda: statuses.failed("a", "")):
        with pytest.raises(ValueError, match="not a transition"):
            impossible()
    assert {n: s.value for n, s in statuses.snapshot().items()} == {"a": UNLOADED, "b": LOADED}


def test_evictions_unload_as_few_idle_unpinned_models_as_make_room_least_recently_used_first() -> None:
    for seed in range(300):
        rng = random.Random(seed)
        loaded = [Resident(f"m{i}", rng.uniform(0, 100), rng.choice([0, 0, 1, 3]), rng.random() < 0.2)
                  for i in range(rng.randint(0, 6))]
        max_loaded = rng.randint(1, 5)
        chosen = evictions(loaded, max_loaded)
        evictable = sorted((r for r in loaded if not r.in_flight and not r.pinned), key=lambda r: r.last_used)
        needed = max(0, len(loaded) - max_loaded + 1)
        if needed > len(evictable):
            assert chosen is None, seed
            continue
        assert chosen == [r.name for r in evictable[:needed]], seed  # the least recently used, no more
        assert len(loaded) - len(chosen) < max_loaded  # room for one more
    assert evictions([Resident("a", 0, 0)], None) == []  # no limit


def test_serve_specs_of_a_folder_load_on_first_request_take_table_options_and_pins(folder: Path) -> None:
    tables = [{"name": "smol", "n_parallel": 3}]  # no path: the folder's smol.gguf, with its own options
    specs = model_specs((), tables, {"n_ctx": 2048}, models_dir=str(folder), pins=("smol",), **SPEC_OPTIONS)
    by_name = {s.name: s for s in specs}
    assert sorted(by_name) == ["broken", "gemma", "smol"]  # no default model beside the folder's
    assert [(s.preload, s.pin) for s in (by_name["gemma"], by_name["broken"])] == [(False, False)] * 2
    assert by_name["smol"].pin and by_name["smol"].config.n_parallel == 3
    assert by_name["smol"].config.model == str(folder / "smol.gguf")
    assert {s.config.n_ctx for s in specs} == {2048}
    with pytest.raises(InvalidRequestError, match="--pin poet: no such model"):
        model_specs((), [], {}, models_dir=str(folder), pins=("poet",), **SPEC_OPTIONS)


def test_the_models_command_lists_a_folder_without_loading_anything(folder: Path) -> None:
    result = CliRunner().invoke(main, ["models", "--models-dir", str(folder)])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()]
    assert rows[0] == ["NAME", "KIND", "SIZE", "PATH"]
    assert [r[:2] for r in rows[1:]] == [["broken", "model"], ["gemma", "model"], ["smol", "model"],
                                         ["lora-smol", "adapter"], ["mmproj-smol", "projector"]]
    assert rows[3][2:4] == ["93.8", "MiB"] and rows[3][4] == str(folder / "smol.gguf")
    assert CliRunner().invoke(main, ["models"]).exit_code == 2  # neither a folder nor a daemon
