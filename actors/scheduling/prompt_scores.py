"""Prompt scoring state: which prompt positions still need their logits row, and what the rows said.

Pure (no threads, no llama calls); used on the batcher's thread. A row at position ``p`` (the
logits after token ``p``) gives the log-probability of token ``p + 1`` given the tokens before
it. A scored sequence (``ScoreState``) needs the rows from ``start - 1`` to ``n_prompt - 2``;
``next_row`` is the first it still needs, so a prefix-cache hit may attach KV only up to there
(attached positions produce no logits) and a preempted sequence resumes without recomputing rows
it already has.

``ScoreCache`` remembers finished sequences' scores by token prefix, so the 4 choices of one
multiple-choice question (which share the question) compute the question's rows once: an entry
for position ``q`` depends only on the tokens up to and including ``q``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# What a logits row costs in prompt tokens of compute, the unit of the scoring share: about two
# for Gemma 3 270M (its 262k-wide output projection is 168M multiply-adds a row, the rest of the
# model ~100M a token), a quarter for SmolLM2-135M (49k wide); ``logits_row_cost`` says per model.
ROW_COST = 2.0


def logits_row_cost(n_vocab: int, n_embd: int, n_params: int) -> float:
    """A model's logits row in prompt tokens of compute: its output projection's multiply-adds
    over the rest of the model's per token (an input embedding is a lookup, counted as the
    projection it is tied to), kept within [0.1, 8] for odd GGUFs."""
    head = n_vocab * n_embd
    return min(8.0, max(0.1, head / max(1, n_params - head)))


@dataclass(frozen=True, slots=True)
class PromptScore:
    """Token ``p``'s log-probability given tokens ``< p``, and the ``n_top`` most likely tokens there."""

    logprob: float
    rank: int  # 1 + how many tokens were more likely
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


@dataclass(slots=True, eq=False)
class ScoreState:
    """One sequence's prompt scoring: positions ``start .. n_prompt - 1`` are reported."""

    start: int  # the first reported position (>= 1: the first token has no logprob)
    n_prompt: int
    n_top: int  # alternatives reported per position
    entries: list[PromptScore | None] = field(default_factory=list)  # by position, once known
    next_row: int = 0  # the first row (position) still to compute
    published: bool = False  # its entries went to the ScoreCache

    def __post_init__(self) -> None:
        if not 1 <= self.start <= self.n_prompt:
            raise ValueError(f"scoring start {self.start} out of range for a {self.n_prompt}-token prompt")
        if not self.entries:
            self.entries = [None] * self.n_prompt
        self.next_row = max(self.next_row, self.start - 1)

    @property
    def row_end(self) -> int:
        """One past the last row scoring needs (the last prompt row predicts a generated token)."""
        return self.n_prompt - 1

    @property
    def done(self) -> bool:
        return self.next_row >= self.row_end

    def rows_in(self, lo: int, hi: int) -> tuple[int, int]:
        """The needed rows among positions ``[lo, hi)`` (an empty range when none)."""
        a, b = max(lo, self.next_row), min(hi, self.row_end)
        return (a, b) if a < b else (a, a)

    def record(self, row: int, score: PromptScore) -> None:
        """Row ``row`` computed: the entry of position ``row + 1``."""
        self.entries[row + 1] = score
        self.next_row = max(self.next_row, row + 1)

    def can_fill(self, other: ScoreState) -> bool:
        """Whether this state's entries, once known, can fill ``other``'s (same or more alternatives,
        and starting no later than ``other`` still needs)."""
        return self.n_top >= other.n_top and self.start <= other.next_row + 1

    def known_from_one(self) -> int:
        """The last position ``K`` such that positions ``1..K`` are all known (0: none)."""
        k = 0
        while k + 1 < self.n_prompt and self.entries[k + 1] is not None:
            k += 1
        return k


def reusable_end(n_tokens: int, state: ScoreState | None, attach_scored: bool) -> int:
    """How many of a prompt's first tokens may take their KV from a cached prefix: all but the last
    (computed for its logits); for a prompt still scoring, none from its first row still needed,
    and none at all unless ``attach_scored``.

    Why none: by default a row's logits depend on the shape of the decode that computes it
    (docs/performance.md, "Where the numbers part"), and a prompt computed from a cached prefix is
    computed in another shape than alone -- its rest in a decode of its own length, the prefix's KV
    in another request's. Measured on lm-eval's choices, that alone moved one-at-a-time scores by a
    median 0.07 nats from llama-cpp-python's; computed whole, they equal it. The rows a prompt
    shares with an earlier one still come from the ``ScoreCache``, so only the prefix's tokens are
    computed again, without their rows. The batch-invariant mode attaches (``attach_scored``):
    there a row is the same in any shape."""
    end = n_tokens - 1
    if state is not None and not state.done:
        end = min(end, state.next_row if attach_scored else 0)
    return max(end, 0)


def fit_chunk(state: ScoreState, n_past: int, n: int, rows_left: int, units_left: float | None,
              row_cost: float = ROW_COST) -> tuple[int, int, int]:
    """The longest chunk of at most ``n`` tokens from ``n_past`` whose rows fit ``rows_left`` and whose
    cost (tokens + ``row_cost`` per row) fits ``units_left`` (None: any): ``(n, lo, hi)``, rows
    ``[lo, hi)``; ``n`` 0 when nothing fits."""
    lo, hi = state.rows_in(n_past, n_past + n)
    if hi - lo > rows_left:
        hi = lo + rows_left
        n = hi - n_past
    while units_left is not None and n > 0 and n + row_cost * (hi - lo) > units_left:
        n -= max(1, int((n + row_cost * (hi - lo) - units_left) // (1 + row_cost)))
        lo, hi = state.rows_in(n_past, n_past + n)
    return (n, lo, hi) if n > 0 else (0, 0, 0)


@dataclass(slots=True)
class _Entry:
    scope: str  # whose: only prompts of the same cache scope read it
    tokens: np.ndarray  # int32, the prompt
    scores: list[PromptScore | None]  # by position; 1..known all set
    known: int
    n_top: int


class ScoreCache:
    """Scores of recent prompts, looked up by longest common prefix within a cache scope; LRU,
    bounded in positions."""

    def __init__(self, max_positions: int = 65536) -> None:
        self.max_positions = max_positions
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._n_positions = 0
        self._next_key = 0
        self.hits = 0  # positions filled from the cache instead of computed

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, scope: str, tokens: Sequence[int], state: ScoreState) -> None:
        """Remember what ``state`` knows of positions ``1..K`` (nothing if position 1 is unknown)."""
        known = state.known_from_one()
        state.published = True
        if known == 0 or known + 1 > self.max_positions:
            return
        self._entries[self._next_key] = _Entry(scope, np.asarray(tokens[:known + 1], dtype=np.int32),
                                               list(state.entries[:known + 1]), known, state.n_top)
        self._next_key += 1
        self._n_positions += known
        while self._n_positions > self.max_positions:
            _, old = self._entries.popitem(last=False)
            self._n_positions -= old.known

    def fill(self, scope: str, tokens: Sequence[int], state: ScoreState) -> int:
        """Copy known entries into ``state`` from ``state.next_row + 1`` on, as far as one cached
        prompt agrees with ``tokens``; return how many positions were filled."""
        want = state.next_row + 1  # the first position whose entry is missing
        if state.done or want < 1:
            return 0
        query = np.asarray(tokens, dtype=np.int32)
        best_key, best_q = -1, want - 1
        for key, entry in self._entries.items():
            if entry.n_top < state.n_top or entry.scope != scope:
                continue
            n = min(len(entry.tokens), len(query))
            differ = np.flatnonzero(entry.tokens[:n] != query[:n])
            common = int(differ[0]) if len(differ) else n
            last = min(entry.known, common - 1, state.row_end)  # position q is valid while q < common
            if last > best_q:
                best_key, best_q = key, last
        if best_key < 0:
            return 0
        entry = self._entries[best_key]
        self._entries.move_to_end(best_key)
        for q in range(want, best_q + 1):
            score = entry.scores[q]
            assert score is not None
            state.record(q - 1, score if entry.n_top == state.n_top else PromptScore(
                score.logprob, score.rank, score.top_ids[:state.n_top], score.top_logprobs[:state.n_top]))
        self.hits += best_q + 1 - want
        return best_q + 1 - want
