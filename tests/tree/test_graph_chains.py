"""Which requests sample inside llama.cpp's graph: chains for what needs no logits on the host,
greedy requests only when the operator asked for in-graph sampling outright; and how few times
an id's chain changes (each change makes llama.cpp re-plan its graph)."""

from __future__ import annotations

import pytest

from llamactor.base.grammar import Grammar
from llamactor.base.sampling import SamplingParams
from llamactor.native.engine import Engine
from llamactor.native.graph_sampling import ChainParams
from llamactor.tree.graph_chains import adoptable, chain_params

PROMPT = "Once upon a time, in a land far away,"


@pytest.mark.pure
def test_a_greedy_request_gets_a_chain_only_when_greedy_runs_in_the_graph() -> None:
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=40)
    assert chain_params(greedy, 7, greedy_in_graph=False) is None
    assert chain_params(greedy, 7, greedy_in_graph=True) is not None
    for in_graph in (False, True):
        p = chain_params(sampled, 7, greedy_in_graph=in_graph)
        assert p is not None and (p.temperature, p.top_k, p.seed) == (0.8, 40, 7)


@pytest.mark.pure
def test_what_needs_the_logits_row_on_the_host_gets_no_chain_either_way() -> None:
    for params in (SamplingParams(temperature=0.8, logprobs=True), SamplingParams(temperature=0.8, max_tokens=0),
                   SamplingParams(temperature=0.8, grammar=Grammar.regex("a+"))):
        assert chain_params(params, 1, greedy_in_graph=True) is None


def test_on_an_engine_whose_decode_runs_ahead_greedy_draws_on_the_host_and_a_chain_in_the_graph(
        start_llm, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a GPU engine does by default (``sample_in_graph`` unset): the CPU backend runs every
    # kind of sampler in the graph, so only the rule decides where each request draws.
    monkeypatch.setattr(Engine, "decodes_async", property(lambda self: True))
    llm = start_llm(n_parallel=2, prefix_cache=False)
    greedy = llm.ask(PROMPT, max_tokens=12, temperature=0, ignore_eos=True)
    assert greedy.usage.completion_tokens == 12 and llm.stats()["tokens_sampled_in_graph"] == 0
    llm.ask(PROMPT, max_tokens=12, temperature=0.8, seed=3, ignore_eos=True)
    assert llm.stats()["tokens_sampled_in_graph"] == 12


class Chain:
    """What ``adoptable`` reads of a chain (a real one needs a llama.cpp sampler)."""

    def __init__(self, params: ChainParams, n_draws: int = 0, shareable: bool = True) -> None:
        self.params, self.n_draws, self.shareable = params, n_draws, shareable


@pytest.mark.pure
def test_only_an_unseeded_request_that_would_build_the_same_chain_takes_over_a_parked_one() -> None:
    parked = Chain(ChainParams(0.8, 40, 0.95, 0.05, seed=11))
    same = Chain(ChainParams(0.8, 40, 0.95, 0.05, seed=99))
    unseeded, seeded = SamplingParams(temperature=0.8), SamplingParams(temperature=0.8, seed=99)
    assert adoptable(unseeded, same, parked)
    assert not adoptable(seeded, same, parked)  # a seed is its own generator
    # A caller who chose the parked chain's seed knows its generator: nobody else draws on from it.
    assert not adoptable(unseeded, same, Chain(parked.params, shareable=False))
    assert not adoptable(unseeded, Chain(same.params, n_draws=3), parked)
    assert not adoptable(unseeded, Chain(ChainParams(0.7, 40, 0.95, 0.05, seed=99)), parked)
    penalised = ChainParams(0.8, 40, 0.95, 0.05, repeat_penalty=1.1, seed=5)
    assert not adoptable(unseeded, Chain(penalised), Chain(penalised))


def changes(llm) -> tuple[int, int, int]:
    s = llm.stats()
    return s["graph_chain_changes"], s["graph_chains_adopted"], s["tokens_sampled_in_graph"]


def test_a_finished_chain_stays_on_its_id_for_the_next_request_and_a_seed_still_draws_its_own(start_llm) -> None:
    llm = start_llm(n_parallel=2, prefix_cache=False, sample_in_graph=True)
    llm.ask(PROMPT, max_tokens=8, temperature=0.8, ignore_eos=True)
    assert changes(llm) == (1, 0, 8)  # attached once, and not detached when it finished
    llm.ask(PROMPT, max_tokens=8, temperature=0.8, ignore_eos=True)
    assert changes(llm) == (1, 1, 16)  # unseeded, the same chain: it took the parked one over
    first = llm.ask(PROMPT, max_tokens=8, temperature=0.8, seed=5, ignore_eos=True)
    assert changes(llm) == (2, 1, 24)  # seeded: a chain of its own seed replaced the parked one
    llm.ask(PROMPT, max_tokens=8, temperature=0.8, ignore_eos=True)
    assert changes(llm) == (3, 1, 32)  # a seeded caller's generator is not drawn on by another
    again = llm.ask(PROMPT, max_tokens=8, temperature=0.8, seed=5, ignore_eos=True)
    assert changes(llm) == (4, 1, 40) and again.token_ids == first.token_ids
    scored = llm.ask(PROMPT, max_tokens=8, temperature=0, logprobs=True, ignore_eos=True)
    # Its rows read logits: the parked chain is detached first, or llama.cpp would keep them.
    assert changes(llm) == (5, 1, 40) and len(scored.logprobs) == 8


def test_with_the_prefix_cache_each_request_changes_a_chain_once_not_twice(start_llm) -> None:
    llm = start_llm(n_parallel=4, sample_in_graph=True)
    for i in range(3):  # each on an id of its own: the last one's cells stay as a cached prefix
        llm.ask(f"{PROMPT} {i}", max_tokens=6, temperature=0.8, seed=i, ignore_eos=True)
    assert changes(llm) == (3, 0, 18)


def test_parked_chains_beyond_n_parallel_are_detached_in_a_step_that_re_plans_anyway(start_llm) -> None:
    llm = start_llm(n_parallel=2, sample_in_graph=True)
    for i in range(2):
        llm.ask(f"{PROMPT} {i}", max_tokens=6, temperature=0.8, seed=i, ignore_eos=True)
    assert changes(llm) == (2, 0, 12)  # two chains parked: as many as a full batch attaches
    llm.ask(f"{PROMPT} 2", max_tokens=6, temperature=0.8, seed=2, ignore_eos=True)
    assert changes(llm) == (4, 0, 18)  # its attach, and the longest-parked chain's detach with it
