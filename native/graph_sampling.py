"""Sampling inside llama.cpp's decode graph (its "backend sampling"): only the chosen token of a
row crosses to the host, not the row's ``n_vocab`` logits.

A request whose whole sampler chain llama.cpp can run in the graph -- logit bias, penalties,
then greedy, or top-k, top-p, min-p, temperature and a seeded draw, in the order of the numpy
sampler (``native/sampling.py``) -- gets a ``GraphChain``; the engine attaches it to the
request's sequence id for the steps in which that sequence samples. Grammars, logprobs and prompt
scoring need the row on the host and stay with the numpy sampler; one step may mix both.

Determinism: the draw is llama.cpp's ``dist`` sampler, a ``std::mt19937`` seeded with the
request's seed. The engine's contexts make it *transactional* (more than one output per sequence
is allowed), so a draw is committed only when the chosen token is accepted into the chain: the
k-th token a request samples uses the k-th number of its generator, however the steps fell. A new
batcher rebuilds the chain from the seed and advances it by the tokens already generated
(``advance``), so a resumed request draws what the crashed one would have drawn.

Everything here runs on the batcher's thread, which alone owns the llama context.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np

TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: llama.cpp sampled nothing for that row


@dataclass(frozen=True, slots=True)
class ChainParams:
    """What a request's chain is made of (the fields of ``SamplingParams`` the chain needs)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int = 0  # 32 bits: llama.cpp's generator takes a uint32_t

    @property
    def penalised(self) -> bool:
        return self.repeat_last_n > 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                           or self.frequency_penalty != 0.0)


class GraphChain:
    """One request's llama.cpp sampler chain, owned by the request until ``free``."""

    def __init__(self, params: ChainParams, n_vocab: int, history: Sequence[int] = (), n_draws: int = 0,
                 shareable: bool = False) -> None:
        """``history``: the tokens before the first sampled one (the penalty window looks at them);
        ``n_draws``: how many tokens the request sampled already (a resumed request); ``shareable``:
        its seed is a secret (the request gave none), so another request that gave none may draw
        on from it -- a caller's own seed makes the generator's state known to that caller."""
        self.params, self.n_vocab, self.shareable = params, n_vocab, shareable
        self.n_draws = n_draws  # tokens sampled with this request's generator so far
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = llama_cpp.llama_sampler_chain_init(chain_params)
        self._dist = None
        for sampler in self._samplers(params, n_vocab):
            llama_cpp.llama_sampler_chain_add(self.ptr, sampler)
        if params.penalised:
            for token in history[-params.repeat_last_n:]:
                llama_cpp.llama_sampler_accept(self.ptr, token)  # fills the window; draws nothing
        self.advance(n_draws)

    def _samplers(self, p: ChainParams, n_vocab: int) -> list[llama_cpp.llama_sampler_p]:
        out = []
        if p.logit_bias:
            biases = (llama_cpp.llama_logit_bias * len(p.logit_bias))(
                *(llama_cpp.llama_logit_bias(token, bias) for token, bias in p.logit_bias))
            out.append(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(p.logit_bias), biases))
        if p.penalised:
            out.append(llama_cpp.llama_sampler_init_penalties(n_vocab, p.repeat_last_n, p.repeat_penalty,
                                                              p.frequency_penalty, p.presence_penalty))
        if p.temperature == 0.0:
            return [*out, llama_cpp.llama_sampler_init_greedy()]
        if p.top_k > 0:
            out.append(llama_cpp.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            out.append(llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            out.append(llama_cpp.llama_sampler_init_min_p(p.min_p, 1))
        out.append(llama_cpp.llama_sampler_init_temp(p.temperature))
        self._dist = llama_cpp.llama_sampler_init_dist(p.seed & 0xFFFFFFFF)
        return [*out, self._dist]

    def accept(self, token: int) -> None:
        """The row's token was taken: commit its draw, add it to the penalty window."""
        llama_cpp.llama_sampler_accept(self.ptr, token)
        self.n_draws += 1

    def renewed(self, history: Sequence[int]) -> GraphChain:
        """A new chain in this one's state (llama.cpp attaches a chain once: a preempted
        request gets a new one for its next sequence id); this one is freed."""
        chain = GraphChain(self.params, self.n_vocab, history, self.n_draws, self.shareable)
        self.free()
        return chain

    def advance(self, n_draws: int) -> None:
        """Move the generator on by ``n_draws`` numbers: llama.cpp's CPU ``dist`` on a one-entry
        array draws exactly one (it keeps its generator aligned with the graph's that way)."""
        if self._dist is None or n_draws <= 0:
            return
        entry = llama_cpp.llama_token_data(0, 0.0, 1.0)
        for _ in range(n_draws):
            array = llama_cpp.llama_token_data_array(ctypes.pointer(entry), 1, -1, False)
            llama_cpp.llama_sampler_apply(self._dist, ctypes.byref(array))

    def free(self) -> None:
        """Free the chain (and its samplers); the engine must not hold it attached any more."""
        if self.ptr is not None:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None


def probe_chain(n_vocab: int) -> GraphChain:
    """A chain with every kind of sampler a request may bring, to ask a backend whether it runs them all."""
    return GraphChain(ChainParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1,
                                  presence_penalty=0.1, frequency_penalty=0.1, logit_bias=((0, -1.0),), seed=1),
                      n_vocab, history=(0,))


class GraphSamplers:
    """The chains attached to the context's sequence ids, and the positions their rows left
    without a shadow.

    A row sampled in the graph carries its sequence's id alone (``ReusableBatch.fill``), so its
    cell is not co-owned by the sequence's shadow. ``cover`` makes the shadow co-own those cells:
    every ``every`` positions while the sequence decodes (half the sliding window, so no such cell
    ever falls out of its window single-owned and gets recycled), and before any KV operation on
    the sequence (the engine calls it), so the rest of the engine sees the usual invariant.
    """

    def __init__(self, ctx: object, memory: object, shadow_offset: int | None, n_swa: int) -> None:
        """``shadow_offset`` None: the model's sequences have no shadows, so nothing to cover."""
        self._ctx, self._memory, self._shadow = ctx, memory, shadow_offset
        self.every = max(1, n_swa // 2) if n_swa > 0 else 256
        self.chains: dict[int, GraphChain] = {}
        # Whether each seq_id carries a chain: one lookup per row per step, on the path between
        # a step's tokens and the next launch (``np.isin`` against the attached ids: ~16 µs a
        # step on 2 cores, 1.7 µs this way). Its last entry stays False: an id past the end
        # (the bench's replayed engine numbers more sequences than its context has) reads it.
        self._carries = np.zeros(llama_cpp.llama_n_seq_max(ctx) + 1, dtype=bool)
        self._unshadowed: dict[int, int] = {}  # seq_id -> its first position the shadow does not own
        self._parked: dict[int, None] = {}  # ids whose chain no request owns any more, oldest first (``park``)

    def attach(self, seq_id: int, chain: GraphChain | None) -> None:
        """Attach ``chain`` to ``seq_id`` (None: detach). llama.cpp re-plans its graph on the next
        decode. A parked chain it replaces is freed (nothing else holds it)."""
        current = self.chains.get(seq_id)
        if current is chain:
            return
        llama_cpp.llama_set_sampler(self._ctx, seq_id, chain.ptr if chain is not None else None)
        if chain is None:
            self.chains.pop(seq_id, None)
        else:
            self.chains[seq_id] = chain
        if seq_id >= len(self._carries) - 1:
            self._carries = np.concatenate([self._carries, np.zeros(seq_id + 2 - len(self._carries), dtype=bool)])
        self._carries[seq_id] = chain is not None
        if seq_id in self._parked and current is not None:
            del self._parked[seq_id]
            current.free()

    def park(self, seq_id: int) -> None:
        """The request that owned ``seq_id``'s chain is over: the chain stays attached -- detaching
        it would make llama.cpp re-plan its graph for every sequence decoding (~27 ms on an H200) --
        until a row on the id needs another chain or none, or a request adopts it (``adopt``)."""
        if seq_id in self.chains:
            self._parked[seq_id] = None

    def parked(self, seq_id: int) -> GraphChain | None:
        """The chain parked on ``seq_id``, if one is."""
        return self.chains.get(seq_id) if seq_id in self._parked else None

    def parked_ids(self) -> list[int]:
        """The ids with a parked chain, the longest parked first."""
        return list(self._parked)

    def adopt(self, seq_id: int) -> GraphChain:
        """Hand the chain parked on ``seq_id`` to the request whose rows land there next."""
        del self._parked[seq_id]
        return self.chains[seq_id]

    def decoded(self, seq_ids: Sequence[int], positions: Sequence[int]) -> None:
        """Rows without a shadow were decoded at these (sequence, position)s."""
        if self._shadow is None:
            return
        for seq_id, pos in zip(seq_ids, positions):
            start = self._unshadowed.setdefault(seq_id, pos)
            if pos + 1 - start >= self.every:
                self.cover(seq_id)

    def cover(self, seq_id: int) -> None:
        """Make ``seq_id``'s shadow co-own the cells its graph-sampled rows left single-owned."""
        start = self._unshadowed.pop(seq_id, None)
        if start is not None and self._shadow is not None:
            llama_cpp.llama_memory_seq_cp(self._memory, seq_id, seq_id + self._shadow, start, -1)

    def cover_all(self) -> None:
        for seq_id in list(self._unshadowed):
            self.cover(seq_id)

    def rows(self, seq_id: np.ndarray, logits: np.ndarray) -> np.ndarray | None:
        """Which entries of a step are sampled in the graph: those asking for logits on a
        sequence with a chain (None: no entry is)."""
        if not self.chains:
            return None
        rows = (logits != 0) & np.take(self._carries, seq_id, mode="clip")
        return rows if rows.any() else None

    def tokens(self, in_graph: np.ndarray | None, logits: np.ndarray, seq_id: np.ndarray, pos: np.ndarray,
               entries: np.ndarray) -> np.ndarray | None:
        """After a decode of ``entries`` (indices into the step's arrays, in batch order): the
        graph's token for each of their output rows (``TOKEN_NULL`` for a host row), or None if
        none was sampled in the graph. The shadows catch up with the rows decoded without them."""
        if in_graph is None:
            return None
        flagged = in_graph[entries]
        if not flagged.any():
            return None
        wants = logits[entries] != 0
        out = np.full(int(np.count_nonzero(wants)), TOKEN_NULL, dtype=np.int32)
        batch_rows = np.flatnonzero(flagged)
        out[np.cumsum(wants)[batch_rows] - 1] = self.sampled_tokens(batch_rows.tolist())
        self.decoded(seq_id[entries][batch_rows].tolist(), pos[entries][batch_rows].tolist())
        return out

    def sampled_tokens(self, rows: Sequence[int]) -> list[int]:
        """The tokens llama.cpp drew for these batch entries (``TOKEN_NULL`` where it drew none)."""
        return [llama_cpp.llama_get_sampled_token_ith(self._ctx, i) for i in rows]

    def detach_all(self) -> None:
        """Detach every chain (parked ones are freed too)."""
        for seq_id in list(self.chains):
            self.attach(seq_id, None)
