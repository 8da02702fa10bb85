"""Which requests sample inside llama.cpp's graph, and which sequence id holds whose chain.

Runs on the batcher's thread. A request whose sampler chain llama.cpp can run in the graph gets a
``GraphChain`` when it arrives (or is resumed after a crash); the chain is attached to the
request's sequence id before a step in which that sequence samples. Every attach and detach makes
llama.cpp re-plan its graph on the next decode (~27 ms on an H200, whoever else is decoding), so
they are kept few: a finished request's chain stays on its id, parked (``GraphSamplers.park``),
and the id's next request takes it over when it would build the same chain and neither it nor
the last owner gave a seed (``adoptable``), or replaces it in one change. A preempted request's chain is detached (it
comes back on another id). An id must never carry a stale chain into a row that reads logits:
llama.cpp would sample that row in the graph and not copy its logits.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

import numpy as np

from llamactor.base.sampling import SamplingParams
from llamactor.base.messages import Progress
from llamactor.native.engine import Engine
from llamactor.tree.grammar_sampler import GrammarSampler
from llamactor.native.graph_sampling import TOKEN_NULL, ChainParams, GraphChain
from llamactor.native.sampling import Sampled
from llamactor.scheduling.sequence import Sequence, StepPlan


def chain_params(params: SamplingParams, seed: int, greedy_in_graph: bool = True) -> ChainParams | None:
    """The chain llama.cpp would run for ``params``, or None when a part of the request needs the
    logits row on the host (a grammar, logprobs, prompt scoring), it samples nothing, or it is
    greedy and ``greedy_in_graph`` is off: the host's argmax then costs less than a chain, whose
    every attach and detach makes llama.cpp re-plan its graph (docs/operations.md)."""
    if params.grammar is not None or params.logprobs or params.prompt_logprobs is not None or params.max_tokens == 0:
        return None
    if params.temperature == 0.0 and not greedy_in_graph:
        return None
    return ChainParams(params.temperature, params.top_k, params.top_p, params.min_p, params.repeat_penalty,
                       params.repeat_last_n, params.presence_penalty, params.frequency_penalty, params.logit_bias,
                       seed & 0xFFFFFFFF)


def adoptable(params: SamplingParams, own: GraphChain, parked: GraphChain) -> bool:
    """Whether a request may take over ``parked`` instead of attaching its own chain ``own``: it
    asked for no seed (so which generator draws for it is free; a seeded one must draw from its
    own), and neither did the parked chain's owner (else that caller could tell what this one
    draws), ``own`` has drawn nothing yet, the two differ in their seeds at most, and neither has
    a penalty window (whose history would have to be replayed)."""
    return (params.seed is None and parked.shareable and own.n_draws == 0 and not own.params.penalised
            and parked.params == dataclasses.replace(own.params, seed=parked.params.seed))


class GraphChains:
    """The batcher's side of in-graph sampling."""

    def __init__(self, engine: Engine, greedy_in_graph: bool, counts: dict[str, Any], max_attached: int) -> None:
        """``greedy_in_graph``: whether greedy requests get a chain too (only when the operator
        asked for in-graph sampling outright: ``sample_in_graph=True``); ``counts``: the batcher's
        counters (``graph_chain_changes``, ``graph_chains_adopted``); ``max_attached``: the most
        chains attached at once, parked ones included (``n_parallel``: what a full batch attaches)."""
        self.engine, self.greedy_in_graph, self.counts = engine, greedy_in_graph, counts
        self.max_attached = max_attached

    def give(self, seq: Sequence, progress: Progress) -> None:
        """Give a new or resumed request its chain, if it can have one; a resumed one's generator
        is moved on by the tokens it generated before (one draw each)."""
        state = seq.state
        if not self.engine.graph_sampling or state is None or state.drafter is not None:
            return  # a drafting request's rows are verified by the host sampler (``draft_verify``)
        if progress.graph_seed is None:
            progress.graph_seed = state.params.seed if state.params.seed is not None else secrets.randbits(32)
        p = chain_params(state.params, progress.graph_seed, self.greedy_in_graph)
        if p is not None:
            state.graph = GraphChain(p, self.engine.n_vocab, history=seq.token_ids, n_draws=len(progress.generated),
                                     shareable=state.params.seed is None)

    def before_step(self, plan: StepPlan) -> None:
        """Give every sequence that samples in this step its chain on its id (taking over the
        id's parked one where it may); detach a chain from an id whose rows read logits
        without it. A parked chain stays through rows that output nothing."""
        graph, changes = self.engine.graph, self.counts["graph_chain_changes"]
        for chunk in plan.chunks:
            state, seq_id = chunk.seq.state, chunk.seq.seq_id
            chain = state.graph if state is not None else None
            on_id = graph.chains.get(seq_id)
            if on_id is chain:
                continue  # as it should be (a decoding request's chain stays on from step to step)
            parked = graph.parked(seq_id)
            if state is not None and chain is not None and chunk.samples:
                if parked is not None and adoptable(state.params, chain, parked):
                    state.graph = self._adopt(seq_id, chain)
                else:
                    self._attach(seq_id, chain)
            elif on_id is not None and (parked is None or chunk.output_last or chunk.n_score_rows):
                self._attach(seq_id, None)
        if self.counts["graph_chain_changes"] > changes:
            self._sweep_parked()

    def _sweep_parked(self) -> None:
        """In a step that re-plans llama.cpp's graph anyway: detach the longest-parked chains
        beyond ``max_attached`` (the same re-plan covers them). llama.cpp builds every attached
        chain's subgraph into each graph it builds (an idle one on a dummy row, not computed), so
        parked chains must not pile up past what a full batch attaches."""
        graph = self.engine.graph
        surplus = len(graph.chains) - self.max_attached
        for seq_id in graph.parked_ids()[:max(0, surplus)]:
            self._attach(seq_id, None)

    def release(self, seq: Sequence, *, finished: bool) -> None:
        """The request left its sequence id: finished, its chain stays there, parked; preempted,
        it is detached and the request gets a new one in the same state for its next id (llama.cpp
        initialises a chain once)."""
        chain = seq.state.graph if seq.state is not None else None
        if chain is None:
            return
        ids = [seq_id for seq_id, attached in self.engine.graph.chains.items() if attached is chain]
        if finished:
            for seq_id in ids:
                self.engine.graph.park(seq_id)
            if not ids:
                chain.free()
            seq.state.graph = None  # type: ignore[union-attr]
            return
        for seq_id in ids:
            self._attach(seq_id, None)
        seq.state.graph = chain.renewed(seq.token_ids)  # type: ignore[union-attr]

    def _attach(self, seq_id: int, chain: GraphChain | None) -> None:
        self.engine.attach_chain(seq_id, chain)
        self.counts["graph_chain_changes"] += 1

    def _adopt(self, seq_id: int, own: GraphChain) -> GraphChain:
        """The id's parked chain, now the request's (its generator goes on where the last owner's
        stopped); the request's own, never attached, is freed."""
        own.free()
        chain = self.engine.graph.adopt(seq_id)
        chain.n_draws = 0
        self.counts["graph_chains_adopted"] += 1
        return chain


def sample_rows(sampler: GrammarSampler, to_sample: list[Sequence], logits: np.ndarray,
                graph_tokens: np.ndarray | None) -> tuple[Sampled, int]:
    """One step's tokens, a row per sequence in ``to_sample``: the graph's where llama.cpp drew
    one (accepted into the request's chain), the numpy sampler's for the rest; and how many came
    from the graph."""
    host = list(range(len(to_sample))) if graph_tokens is None else \
        [i for i, t in enumerate(graph_tokens.tolist()) if t == TOKEN_NULL]
    if len(host) == len(to_sample):
        return sampler.sample(logits, [s.state.row_spec(s.token_ids) for s in to_sample],
                              [s.state.matcher for s in to_sample]), 0
    assert graph_tokens is not None
    out = Sampled(graph_tokens.tolist(), [None] * len(to_sample), [[] for _ in to_sample])
    for seq, token in zip(to_sample, out.tokens):
        if token != TOKEN_NULL:
            seq.state.graph.accept(token)
    if host:
        rest = [to_sample[i] for i in host]
        drawn = sampler.sample(logits[host], [s.state.row_spec(s.token_ids) for s in rest],
                               [s.state.matcher for s in rest])
        for j, i in enumerate(host):
            out.tokens[i], out.logprobs[i], out.top[i] = drawn.tokens[j], drawn.logprobs[j], drawn.top[j]
    return out, len(to_sample) - len(host)
