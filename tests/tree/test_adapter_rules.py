"""LoRA adapters without a model: ``Config.loras`` and a request's adapter set as callers give
them, llama-server's ids, the cache scope of a set, and the scheduler's turns between adapter
sets -- property-tested on seeded random workloads: every step decodes one set, and no set with
running sequences waits more steps than there are sets."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from llamactor.base.adapters import adapter_scope, adapter_set, from_ids, parse_loras
from llamactor.base.config import Config
from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import InvalidRequestError
from llamactor.base.request import GenerationRequest
from llamactor.tree.tiers.ram import CacheTiers
from llamactor.dialects.context import RequestContext
from llamactor.native.kv_state import SeqState
from llamactor.scheduling.adapter_turns import AdapterTurns
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.scheduler import Scheduler
from llamactor.serving.model_specs import ModelSpec, specs_from

from tests.support.scheduling import make_scheduler, make_seq, run_to_end

pytestmark = pytest.mark.pure

STYLE = (("style", 1.0),)


def test_loras_are_given_as_name_equals_path_pairs_or_a_mapping_and_keep_their_order() -> None:
    assert parse_loras(["b=/x/b.gguf", ("a", "/x/a.gguf")]) == (("b", "/x/b.gguf"), ("a", "/x/a.gguf"))
    assert parse_loras({"b": "/b", "a": "/a"}) == (("b", "/b"), ("a", "/a"))
    assert Config(loras=["style=/s.gguf"]).loras == (("style", "/s.gguf"),)  # type: ignore[arg-type]
    for bad in (["nopath"], ["a=/x", "a=/y"], ["two words=/x"], [("a", "")]):
        with pytest.raises(InvalidRequestError, match="loras"):
            parse_loras(bad)


def test_a_requests_adapter_set_is_sorted_without_zero_scales_and_checked_against_the_models_names() -> None:
    assert adapter_set({"b": 0.5, "a": 1, "c": 0.0}) == (("a", 1.0), ("b", 0.5))
    assert adapter_set(None) == adapter_set({}) == adapter_set({"a": 0}) == ()
    with pytest.raises(InvalidRequestError, match="unknown LoRA adapter 'z'.*a, b"):
        adapter_set({"z": 1.0}, ["a", "b"])
    for scale in (float("nan"), 1e9, "1", True):
        with pytest.raises(InvalidRequestError, match="scales"):
            adapter_set({"a": scale})
    request = GenerationRequest.build(SamplingParams(), prompt="x", lora={"a": 2.0}, adapters=["a"])
    assert request.lora == (("a", 2.0),)
    assert all(m.lora == (("a", 2.0),) for m in request.generate_messages("r", [None, None], 0.0))  # type: ignore[list-item]


def test_llama_server_ids_follow_the_flag_order_and_an_unknown_id_is_refused() -> None:
    assert from_ids([{"id": 1, "scale": 0.5}, {"id": 0}], ["a", "b"]) == {"b": 0.5, "a": 1.0}
    with pytest.raises(InvalidRequestError, match="unknown adapter id 2"):
        from_ids([{"id": 2, "scale": 1.0}], ["a", "b"])
    with pytest.raises(InvalidRequestError, match="no LoRA adapters"):
        from_ids([{"id": 0}], [])


def test_each_adapter_set_has_its_own_cache_scope_and_the_base_model_keeps_the_tenants() -> None:
    scopes = {adapter_scope("t", s) for s in [(), STYLE, (("style", 0.5),), (("a", 1.0), ("style", 1.0))]}
    assert len(scopes) == 4 and adapter_scope("t", ()) == "t"
    assert make_seq(3, lora=STYLE).scope != make_seq(3).scope


def test_an_adapter_sequence_does_not_attach_the_base_models_cached_prefix_or_pinned_system_prompt() -> None:
    index = PrefixIndex(n_seq_ids=8, n_cells=1000)
    pinned, _ = index.allocate(None)
    index.extend(pinned, [1, 2, 3], 0.0)
    index.pin(pinned)
    s = make_scheduler(index=index, batch_size=1)
    base = make_seq(0, rid="base", tokens=[1, 2, 3, 4, 5, 6])
    s.add(base)
    run_to_end(s, base)
    styled = make_seq(0, rid="styled", tokens=[1, 2, 3, 4, 5, 6, 7], lora=STYLE)
    s.add(styled)
    s.schedule(0.0)
    assert styled.n_past == 0 and styled.n_cached == 0
    again = make_seq(0, rid="base2", tokens=[1, 2, 3, 4, 5, 6, 7])
    s.add(again)
    run_to_end(s, styled)
    s.schedule(0.0)
    assert again.n_cached == 6  # the base entry: its six tokens


def simulate(seed: int, n_sets: int, steps: int = 400) -> tuple[Scheduler, list[tuple[tuple, set[tuple]]]]:
    """A random workload over ``n_sets`` adapter sets: each step, maybe a newcomer; the plan's
    chunks are computed and sampling ones get a token; a sequence ends after its own length.
    Returns the scheduler and, per step, (the plan's set, the sets of its chunks' sequences)."""
    rng = random.Random(seed)
    sets = [()] + [((f"a{i}", 1.0),) for i in range(1, n_sets)]
    s = make_scheduler(n_parallel=6, n_batch=32, batch_size=1, max_queue=1000)
    lengths: dict[str, int] = {}
    log = []
    for step in range(steps):
        if rng.random() < 0.6:
            rid = f"r{step}"
            seq = make_seq(rng.randint(1, 40), at=float(step), rid=rid, lora=rng.choice(sets))
            lengths[rid] = rng.randint(1, 12)
            s.add(seq)
        running_sets = {q.adapters for q in s.running}
        plan = s.schedule(float(step))
        log.append((plan.adapters, {c.seq.adapters for c in plan.chunks}, running_sets | {q.adapters for q in plan.admitted}))
        for chunk in plan.chunks:
            s.computed(chunk, float(step))
            if chunk.samples:
                chunk.seq.token_ids.append(7)
                if chunk.seq.n_generated >= lengths[chunk.seq.request_id]:
                    s.finish(chunk.seq, float(step))
    return s, log


@pytest.mark.parametrize("seed", range(8))
def test_every_step_decodes_one_adapter_set_and_no_set_is_passed_over_twice_by_another_while_it_runs(
        seed: int) -> None:
    n_sets = 1 + seed % 4
    _, log = simulate(seed, n_sets)
    served_since: dict[tuple, set[tuple]] = {}  # running set -> the sets served since its last turn
    for planned, chunk_sets, running in log:
        assert chunk_sets <= {planned}, "one llama_decode runs under one adapter set"
        if not chunk_sets:
            continue
        for group in running - {planned}:
            passed = served_since.setdefault(group, set())
            assert planned not in passed, f"{planned} served twice while {group} waited"
            passed.add(planned)
            assert len(passed) < n_sets
        served_since[planned] = set()
        for gone in set(served_since) - running:
            del served_since[gone]
    assert {p for p, c, _ in log if c} == ({()} | {((f"a{i}", 1.0),) for i in range(1, n_sets)}), "every set ran"


def test_with_one_adapter_set_the_scheduler_packs_as_before_and_two_sets_alternate() -> None:
    turns = AdapterTurns()
    a, b = make_seq(3, at=0.0, rid="a"), make_seq(3, at=1.0, rid="b", lora=STYLE)
    assert list(turns.order([a])) == [()]
    served = []
    for _ in range(4):
        first = next(turns.order([a, b]))
        turns.served(first)
        served.append(first)
    assert served == [(), STYLE, (), STYLE]  # the older sequence's set first, then in turn
    s = make_scheduler(n_parallel=3, batch_size=3)
    for i in range(3):
        s.add(make_seq(0, rid=f"b{i}", tokens=[10 * i + 1, 10 * i + 2]))
    assert len(s.schedule(0.0).chunks) == 3  # all on the base model: one step for all, as without adapters


def test_a_request_context_turns_the_model_name_and_lora_ids_into_the_requests_adapter_set() -> None:
    ctx = RequestContext("r", "style", SamplingParams(), adapters=("style", "legal"), adapter="style")
    lora = ctx.lora([{"id": 1, "scale": 0.5}])
    request = GenerationRequest.build(SamplingParams(), prompt="x", **lora)
    assert request.lora == (("legal", 0.5), ("style", 1.0))
    assert ctx.lora([{"id": 0, "scale": 0.0}])["lora"] == {"style": 0.0}  # the ids override the model's
    with pytest.raises(InvalidRequestError, match="unknown adapter id 2"):
        ctx.lora([{"id": 2}])
    unknown_model = RequestContext("r", "", SamplingParams(), adapters=None)  # a batch file checked before its run
    assert GenerationRequest.build(SamplingParams(), prompt="x", **unknown_model.lora([{"id": 3}])).lora == (("#3", 1.0),)


def test_the_turns_count_the_steps_that_switch_adapter_sets() -> None:
    s, log = simulate(3, 2)
    served = [p for p, c, _ in log if c]
    assert s.turns.switches == sum(a != b for a, b in zip([()] + served, served)) > 0


def test_each_model_of_a_router_has_its_own_loras_from_its_models_table() -> None:
    specs = specs_from([{"name": "chat", "path": "/m.gguf", "loras": {"style": "/s.gguf"}},
                        {"name": "plain", "path": "/m.gguf"}])
    assert [s.config.loras for s in specs] == [(("style", "/s.gguf"),), ()]
    with pytest.raises(InvalidRequestError, match="model 'bad': loras"):
        ModelSpec.from_dict({"name": "bad", "loras": ["nopath"]})


def test_the_disk_tier_keeps_adapter_kv_only_with_the_very_adapter_files_and_tells_their_scopes_apart(
        tmp_path: Path) -> None:
    model, adapter = tmp_path / "m.gguf", tmp_path / "style.gguf"
    model.write_bytes(b"model")
    adapter.write_bytes(b"adapter one")

    def tiers() -> CacheTiers:
        config = Config(cache_dir=str(tmp_path / "cache"), loras=[f"style={adapter}"])  # type: ignore[arg-type]
        found = CacheTiers.for_config(config, str(model))
        assert found is not None and found.disk is not None
        return found

    first = tiers()
    styled = adapter_scope("default", STYLE)
    first.disk.put(styled, [1, 2, 3], SeqState(3, b"x" * 100, (b"y" * 10,)))  # type: ignore[union-attr]
    assert tiers().disk.lookup(styled, [1, 2, 3]).n_tokens == 3  # type: ignore[union-attr]
    assert tiers().disk.lookup("default", [1, 2, 3]).n_tokens == 0  # type: ignore[union-attr]
    adapter.write_bytes(b"adapter two, retrained")
    assert tiers().disk.lookup(styled, [1, 2, 3]).n_tokens == 0  # type: ignore[union-attr]
