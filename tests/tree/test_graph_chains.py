"""Which requests sample inside llama.cpp's graph: chains for what needs no logits on the host,
and greedy requests only when the operator asked for in-graph sampling outright."""

from __future__ import annotations

import pytest

from llamactor.base.grammar import Grammar
from llamactor.base.sampling import SamplingParams
from llamactor.native.engine import Engine
from llamactor.tree.graph_chains import chain_params

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
