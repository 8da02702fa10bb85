"""Sampling inside llama.cpp's graph: the same tokens as on the host where they must be, the same
draws run after run and after a resume, the numpy sampler's distribution, and every request that
cannot be sampled there still served beside those that are."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

from llamactor.native.engine import Engine
from llamactor.native.graph_sampling import TOKEN_NULL, ChainParams, GraphChain

from tests.conftest import NotAMessage, batcher_ref

PROMPT = "Once upon a time, in a land far away,"
DEFAULT_CHAIN = ChainParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


@pytest.fixture(scope="module")
def engine(model_path: str) -> Iterator[Engine]:
    e = Engine(model_path, n_ctx=4096, n_batch=512, n_ubatch=512, n_seq_max=64, n_threads=2, graph_sampling=True)
    yield e
    e.close()


def prefilled(engine: Engine, seq_id: int) -> list[int]:
    """The prompt's KV on ``seq_id`` but for its last token, which the tests decode themselves."""
    engine.seq_rm(seq_id)
    tokens = engine.tokenizer.tokenize(PROMPT)
    engine.prefill(seq_id, tokens[:-1])
    return tokens


def draw_last(engine: Engine, seq_ids: list[int], tokens: list[int]) -> np.ndarray:
    """Decode the prompt's last token on every one of ``seq_ids`` (each holding the rest of the
    prompt) with logits, then forget it again: the same computation every time."""
    n = len(seq_ids)
    result = engine.decode(np.full(n, tokens[-1], np.int32), np.full(n, len(tokens) - 1, np.int32),
                           np.array(seq_ids, np.int32), np.ones(n, np.int8))
    for seq_id in seq_ids:
        engine.seq_rm(seq_id, len(tokens) - 1, -1)
    return result.tokens if result.tokens is not None else result.logits.copy()


def test_the_cpu_backend_runs_every_kind_of_sampler_a_request_may_bring_in_the_graph(engine: Engine) -> None:
    assert engine.graph_sampling


def test_a_cpu_only_engine_samples_on_the_host_unless_asked(model_path: str) -> None:
    e = Engine(model_path, n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=2, n_threads=2)
    try:
        assert e.info.n_gpu_layers == 0 and not e.graph_sampling  # where ggml's samplers cost more than they save
    finally:
        e.close()


def test_a_greedy_chain_draws_the_argmax_of_the_logits_the_host_would_have_read(engine: Engine) -> None:
    tokens = prefilled(engine, 0)
    host_logits = draw_last(engine, [0], tokens)
    chain = GraphChain(ChainParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0), engine.n_vocab)
    engine.attach_chain(0, chain)
    try:
        graph_token = draw_last(engine, [0], tokens)
    finally:
        engine.attach_chain(0, None)
        chain.free()
    assert int(graph_token[0]) == int(host_logits[0].argmax())


def draws(engine: Engine, tokens: list[int], chain: GraphChain, n: int) -> list[int]:
    """``n`` draws of ``chain`` on sequence 0, each accepted, all from the same logits."""
    engine.attach_chain(0, chain)
    try:
        out = []
        for _ in range(n):
            token = int(draw_last(engine, [0], tokens)[0])
            chain.accept(token)
            out.append(token)
        return out
    finally:
        engine.attach_chain(0, None)


def test_a_seeded_chain_draws_the_same_tokens_run_after_run_and_after_being_rebuilt_mid_way(engine: Engine) -> None:
    tokens = prefilled(engine, 0)
    params = ChainParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7)  # a wide distribution
    first, second = GraphChain(params, engine.n_vocab), GraphChain(params, engine.n_vocab)
    resumed = GraphChain(params, engine.n_vocab, n_draws=6)  # as a new batcher rebuilds it after 6 tokens
    try:
        run = draws(engine, tokens, first, 12)
        assert draws(engine, tokens, second, 6) == run[:6]
        second = second.renewed(tokens)  # as after a preemption: llama.cpp attaches a chain only once
        assert draws(engine, tokens, second, 6) == run[6:]
        assert draws(engine, tokens, resumed, 6) == run[6:]
        assert len(set(run)) > 3  # the draws really vary: the generator moves on at each accept
    finally:
        for chain in (first, second, resumed):
            chain.free()


def numpy_distribution(logits: np.ndarray, p: ChainParams) -> dict[int, float]:
    """The probabilities the numpy sampler draws the default chain's token from (top-k, then top-p
    and min-p on the top-k softmax, then temperature over what is kept)."""
    ids = np.argsort(-logits, kind="stable")[:p.top_k]
    vals = logits[ids].astype(np.float64)
    probs = np.exp(vals - vals.max())
    probs /= probs.sum()
    keep = ((np.cumsum(probs) - probs) < p.top_p) & (probs >= p.min_p * probs[0])
    kept = np.exp((vals[keep] - vals[0]) / p.temperature)
    return dict(zip(ids[keep].tolist(), (kept / kept.sum()).tolist()))


def test_the_graph_draws_the_default_chain_from_the_distribution_the_numpy_sampler_uses(engine: Engine) -> None:
    seq_ids = list(range(1, 64))
    tokens = prefilled(engine, 0)
    for seq_id in seq_ids:
        engine.seq_rm(seq_id)
        engine.seq_cp(0, seq_id, 0, len(tokens) - 1)
    expected = numpy_distribution(draw_last(engine, [0], tokens)[0], DEFAULT_CHAIN)
    counts: Counter[int] = Counter()
    for round_ in range(24):  # 24 x 63 = 1,512 draws, each with its own fixed seed
        chains = [GraphChain(ChainParams(0.8, 40, 0.95, 0.05, seed=round_ * 100 + s), engine.n_vocab) for s in seq_ids]
        for seq_id, chain in zip(seq_ids, chains):
            engine.attach_chain(seq_id, chain)
        counts.update(int(t) for t in draw_last(engine, seq_ids, tokens))
        for seq_id, chain in zip(seq_ids, chains):
            engine.attach_chain(seq_id, None)
            chain.free()
    n = sum(counts.values())
    assert TOKEN_NULL not in counts and set(counts) <= set(expected), "drew a token the chain excludes"
    # Pearson's chi-square over the tokens expected 5+ times (the rest pooled); the seeds are fixed,
    # so the outcome is too: the bound is the 99.99th percentile, far from a chance failure.
    big = [t for t, q in expected.items() if q * n >= 5]
    cells = [(counts[t], expected[t] * n) for t in big]
    rest = n - sum(o for o, _ in cells), n * (1 - sum(expected[t] for t in big))
    if rest[1] >= 5:
        cells.append(rest)
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    assert chi2 < dof + 3.72 * math.sqrt(2 * dof) + 10, (chi2, dof, counts.most_common(8), sorted(expected.items(), key=lambda kv: -kv[1])[:8])


def test_a_bias_in_the_graph_keeps_the_most_likely_token_out(engine: Engine) -> None:
    tokens = prefilled(engine, 0)
    best = int(draw_last(engine, [0], tokens)[0].argmax())
    chain = GraphChain(ChainParams(0.0, 0, 1.0, 0.0, logit_bias=((best, -100.0),)), engine.n_vocab)
    try:
        assert draws(engine, tokens, chain, 1)[0] != best
    finally:
        chain.free()


def test_greedy_requests_give_the_same_tokens_whether_sampled_in_the_graph_or_on_the_host(start_llm) -> None:
    prompts = ["The capital of France is", "def fibonacci(n):", PROMPT]
    outs = {}
    for in_graph in (True, False):
        llm = start_llm(n_parallel=4, sample_in_graph=in_graph, prefix_cache=False)
        outs[in_graph] = [llm.ask(p, max_tokens=24, temperature=0, ignore_eos=True).token_ids for p in prompts]
        assert (llm.stats()["tokens_sampled_in_graph"] > 0) == in_graph
        llm.close()
    assert outs[True] == outs[False]  # one request at a time: the same logits, so the same argmax


def test_a_seeded_request_sampled_in_the_graph_gives_the_same_text_run_after_run(start_llm) -> None:
    llm = start_llm(n_parallel=4, prefix_cache=False, sample_in_graph=True)
    runs = [llm.ask(PROMPT, max_tokens=32, seed=42, temperature=0.9, ignore_eos=True) for _ in range(2)]
    other = llm.ask(PROMPT, max_tokens=32, seed=43, temperature=0.9, ignore_eos=True)
    assert runs[0].token_ids == runs[1].token_ids != other.token_ids
    assert llm.stats()["tokens_sampled_in_graph"] == 96


def test_grammar_logprob_and_graph_requests_share_steps_and_each_gets_what_it_asked_for(start_llm) -> None:
    llm = start_llm(n_parallel=6, batch_timeout_ms=50, sample_in_graph=True)
    futures = [llm.submit(PROMPT, max_tokens=16, seed=s, temperature=0.8, ignore_eos=True) for s in range(3)]
    scored = llm.submit(PROMPT, max_tokens=16, logprobs=True, top_logprobs=2, temperature=0, ignore_eos=True)
    digits = llm.submit("Phone:", grammar=r'root ::= " " [0-9] [0-9] [0-9]', max_tokens=8, temperature=0.7, seed=1)
    plain = [f.result(timeout=120) for f in futures]
    assert all(c.usage.completion_tokens == 16 for c in plain)
    assert len(scored.result(timeout=120).logprobs) == 16
    text = digits.result(timeout=120).text
    assert len(text) == 4 and text[1:].isdigit(), text
    stats = llm.stats()
    assert 48 <= stats["tokens_sampled_in_graph"] < stats["tokens_generated"]


def test_seeded_graph_sampled_requests_preempted_for_room_finish_with_their_tokens(start_llm) -> None:
    llm = start_llm(n_parallel=4, n_ctx=256, prefix_cache=False, batch_timeout_ms=50, sample_in_graph=True)  # 4 x 120 tokens do not fit
    futures = [llm.submit(f"{PROMPT} {i}", max_tokens=100, seed=i, temperature=0.9, ignore_eos=True) for i in range(4)]
    done = [f.result(timeout=300) for f in futures]
    assert all(c.usage.completion_tokens == 100 for c in done)
    stats = llm.stats()
    assert stats["preemptions"] > 0 and stats["tokens_sampled_in_graph"] == 400


def test_a_seeded_graph_sampled_stream_goes_on_across_two_batcher_crashes(start_llm) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=5, sample_in_graph=True)

    async def run() -> tuple[list[str], object]:
        stream = llm.stream_async(PROMPT, temperature=0.9, seed=11, repeat_penalty=1.2, max_tokens=60, ignore_eos=True)
        pieces = []
        async for piece in stream.pieces():
            pieces.append(piece.text)
            if len(pieces) in (3, 20):
                batcher_ref(llm).tell(NotAMessage())
        return pieces, stream.completion

    pieces, c = asyncio.run(run())
    assert llm.stats()["restarts"] == 2
    assert "".join(pieces) == c.text and c.usage.completion_tokens == 60  # type: ignore[attr-defined]
    assert llm.stats()["tokens_sampled_in_graph"] > 0  # the new batcher's chain, advanced past the draws
