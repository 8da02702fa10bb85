"""Which requests sample inside llama.cpp's graph, and which sequence id holds whose chain.

Runs on the batcher's thread. A request whose sampler chain llama.cpp can run in the graph gets a
``GraphChain`` when it arrives (or is resumed after a crash); the chain is attached to the
request's sequence id before a step in which that sequence samples, and detached when the request
finishes or is preempted, or when another request's rows land on that id -- an id must never carry
a stale chain: llama.cpp would sample that row in the graph and not copy its logits.
"""

from __future__ import annotations

import secrets

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


class GraphChains:
    """The batcher's side of in-graph sampling."""

    def __init__(self, engine: Engine, greedy_in_graph: bool) -> None:
        """``greedy_in_graph``: whether greedy requests get a chain too (only when the operator
        asked for in-graph sampling outright: ``sample_in_graph=True``)."""
        self.engine, self.greedy_in_graph = engine, greedy_in_graph

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
            state.graph = GraphChain(p, self.engine.n_vocab, history=seq.token_ids, n_draws=len(progress.generated))

    def before_step(self, plan: StepPlan) -> None:
        """Attach the chain of every sequence that samples in this step; detach a chain left on
        the id of a sequence that does not own it."""
        attached = self.engine.graph.chains
        for chunk in plan.chunks:
            seq, seq_id = chunk.seq, chunk.seq.seq_id
            chain = seq.state.graph if seq.state is not None else None
            on_id = attached.get(seq_id)
            if on_id is chain:
                continue  # as it should be (a decoding request's chain stays on from step to step)
            if chain is not None and chunk.samples:
                self.engine.attach_chain(seq_id, chain)
            elif on_id is not None:
                self.engine.attach_chain(seq_id, None)

    def release(self, seq: Sequence, *, finished: bool) -> None:
        """The request left its sequence id (finished, or preempted): detach its chain; free it
        once the request is over."""
        chain = seq.state.graph if seq.state is not None else None
        if chain is None:
            return
        for seq_id, attached in list(self.engine.graph.chains.items()):
            if attached is chain:
                self.engine.attach_chain(seq_id, None)
        if finished:
            chain.free()
            seq.state.graph = None  # type: ignore[union-attr]
        else:  # it comes back on another id, and llama.cpp initialises a chain once
            seq.state.graph = chain.renewed(seq.token_ids)  # type: ignore[union-attr]


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
