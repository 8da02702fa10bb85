"""Sampling for a whole step, with numpy, on the logits rows llama.cpp returned.

The order follows llama.cpp's default chain: logit bias, penalties, the grammar mask, top-k, top-p,
min-p, then temperature and the draw. A step whose rows are all plain greedy costs one ``argmax``
over the batch. A sampled row never sorts its 262k-entry vocabulary: its candidates are the
entries within a margin of the row's maximum (one vectorised comparison), widened until they hold
the row's top-k (or its nucleus when top-k is off); only those are partitioned and sorted. A
nucleus wider than a few thousand tokens (a flat row under top-p or min-p) is found by halving
with ``argpartition`` and drawn from unsorted (``_wide_nucleus``), where llama.cpp's top-p sorts
the whole vocabulary once its first 256 candidates fall short. A row with temperature alone draws
over the whole row in vocabulary order, sorting nothing.

Why numpy and not torch: a step has a handful of rows and the prefilter keeps each sort small, so
numpy is faster here (no thread-pool wake-ups: 2.7 vs 4.4 ms for 16 rows with the default
filters, 8.7 vs 21.6 ms with top-5 logprobs, measured against the torch sampler it replaced), and
the process never loads torch's ~185 MiB (docs/operations.md, "Sizing").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_SORTED_BAND = 4096  # a wide nucleus's edge is sorted once the undecided band is this small
_FIRST_MARGIN = 8.0  # nats below the row's maximum: ~100 - 1,000 of Gemma's tokens, usually enough


@dataclass(slots=True)
class RowSpec:
    """One row to sample: its filters, its random stream and the tokens its penalties look at."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    presence_penalty: float
    frequency_penalty: float
    rng: np.random.Generator
    recent_tokens: Sequence[int]  # the last repeat_last_n tokens (prompt + generated)
    want_logprob: bool
    top_logprobs: int = 0  # how many most likely alternatives to report with the chosen token
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added before anything else
    allowed: np.ndarray | None = None  # this step's grammar mask: packed int32 bits, bit t = token t allowed

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusted(self) -> bool:
        """Whether the row's logits change before the draw (penalties, bias, grammar mask)."""
        return self.penalised or bool(self.logit_bias) or self.allowed is not None

    @property
    def penalised(self) -> bool:
        return bool(self.recent_tokens) and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)


def _apply_penalties(row: np.ndarray, spec: RowSpec) -> None:
    """llama.cpp's penalties sampler on one row, in place."""
    counts = Counter(spec.recent_tokens)
    ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    n = np.fromiter(counts.values(), dtype=row.dtype, count=len(counts))
    vals = row[ids]
    if spec.repeat_penalty != 1.0:
        vals = np.where(vals > 0, vals / spec.repeat_penalty, vals * spec.repeat_penalty)
    row[ids] = vals - n * spec.frequency_penalty - spec.presence_penalty


def _adjust(row: np.ndarray, spec: RowSpec) -> None:
    """Bias, then penalties, then the grammar mask, on one row in place (llama.cpp's order)."""
    if spec.logit_bias:
        pairs = [(t, b) for t, b in spec.logit_bias if t < row.shape[0]]
        if pairs:
            ids, biases = zip(*pairs)
            row[list(ids)] += np.asarray(biases, dtype=row.dtype)
    if spec.penalised:
        _apply_penalties(row, spec)
    if spec.allowed is not None:
        allowed = np.unpackbits(spec.allowed.view(np.uint8), bitorder="little")[:row.shape[0]]
        row[allowed == 0] = -np.inf


def log_sum_exp(row: np.ndarray) -> float:
    """``log(sum(exp(row)))`` over a whole row, without overflow."""
    top = float(row.max())
    return top + float(np.log(np.exp(row - top, dtype=row.dtype).sum(dtype=np.float64)))


def top_candidates(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest entries of ``row`` (a 1-D float array) and their ids, largest first.

    Only the entries within a margin of the maximum are partitioned: the margin doubles until it
    holds ``k`` of them, so the answer is exact whatever the row looks like."""
    k = min(k, row.shape[0])
    top = row.max()
    margin = _FIRST_MARGIN
    while True:
        floor = top - margin if margin < 1e4 else -np.inf  # -inf: every entry, masked ones too
        ids = np.flatnonzero(row >= floor)
        if ids.size >= k:
            break
        margin *= 2
    if ids.size > k:
        ids = ids[np.argpartition(row[ids], ids.size - k)[ids.size - k:]]
    ids = ids[np.argsort(-row[ids], kind="stable")]
    return row[ids], ids


def _nucleus(row: np.ndarray, spec: RowSpec) -> tuple[np.ndarray, np.ndarray]:
    """A row without top-k: the tokens its top-p and min-p keep (values, ids). The usual peaked
    row's are among the few tokens within ``_FIRST_MARGIN`` of its best (sorted, as a full sort
    would order them); a wider nucleus is found without sorting the row (``_wide_nucleus``)."""
    lse = log_sum_exp(row)  # top-p runs over the whole distribution: the full-vocabulary normaliser
    near = np.flatnonzero(row >= row.max() - _FIRST_MARGIN)
    if near.size <= _SORTED_BAND:
        near = near[np.argsort(-row[near], kind="stable")]
        vals = row[near]
        probs = np.exp(vals.astype(np.float64) - lse)
        if near.size == row.shape[0] or probs.sum() >= spec.top_p or probs[-1] < spec.min_p * probs[0]:
            keep = _kept(probs, spec)
            return vals[keep], near[keep]
    return _wide_nucleus(row, spec, lse)


def _kept(probs: np.ndarray, spec: RowSpec) -> np.ndarray:
    """Which of the candidates ``probs`` (largest first) top-p and min-p keep: llama.cpp's rules
    (a token stays while the mass before it is under top_p; the best token always stays)."""
    keep = (np.cumsum(probs) - probs) < spec.top_p
    keep &= probs >= spec.min_p * probs[0]
    keep[0] = True
    return keep


def _wide_nucleus(row: np.ndarray, spec: RowSpec, lse: float) -> tuple[np.ndarray, np.ndarray]:
    """The tokens top-p and min-p keep where the nucleus is wider than ``_nucleus`` looked, in no
    particular order (the draw's distribution does not depend on it). A full sort would cost
    O(n log n) on the batcher thread -- a flat row's nucleus is most of its 262k entries -- so
    the edge is found by halving: the better half of the undecided band (one ``argpartition``)
    is kept whole if the mass before it plus its own is under top_p, else the edge lies inside
    it; the work is about 2n, and only the last band (``_SORTED_BAND`` tokens at most) is sorted."""
    ids, vals, probs = _eligible_band(row, spec, lse)
    if spec.top_p >= 1.0 or probs.sum() < spec.top_p:
        return vals, ids  # every eligible token is inside the nucleus: min-p alone decides
    kept: list[np.ndarray] = []
    mass_before = 0.0  # of the tokens kept so far: every one of them beats every token in the band
    while ids.size > _SORTED_BAND:
        n_lower = ids.size - ids.size // 2
        order = np.argpartition(vals, n_lower)
        ids, vals, probs = ids[order], vals[order], probs[order]
        upper_mass = float(probs[n_lower:].sum())
        if mass_before + upper_mass < spec.top_p:  # the whole upper half is inside the nucleus
            kept.append(ids[n_lower:])
            mass_before += upper_mass
            ids, vals, probs = ids[:n_lower], vals[:n_lower], probs[:n_lower]
        else:  # the nucleus ends inside the upper half: the lower half is out
            ids, vals, probs = ids[n_lower:], vals[n_lower:], probs[n_lower:]
    order = np.argsort(-vals, kind="stable")
    probs = probs[order]
    kept.append(ids[order][(mass_before + np.cumsum(probs) - probs) < spec.top_p])
    nucleus = np.concatenate(kept)
    return row[nucleus], nucleus


def _eligible_band(row: np.ndarray, spec: RowSpec, lse: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tokens min-p keeps within a margin of the row's maximum (doubling from
    ``_FIRST_MARGIN``) until their mass reaches top_p, or all that min-p keeps: (ids, values,
    probabilities). The nucleus is among them: a peaked row's are a few thousand."""
    top = float(row.max())
    floor_p = spec.min_p * float(np.exp(top - lse))  # min-p's cut, as llama.cpp's probs[0] * min_p
    margin = _FIRST_MARGIN
    while True:
        everything = spec.top_p >= 1.0 or margin >= 1e4 or (spec.min_p > 0.0 and margin >= -np.log(spec.min_p))
        ids = np.flatnonzero(row > -np.inf) if everything else np.flatnonzero(row >= top - margin)
        probs = np.exp(row[ids].astype(np.float64) - lse)
        if spec.min_p > 0.0:
            ids, probs = ids[probs >= floor_p], probs[probs >= floor_p]
        if everything or probs.sum() >= spec.top_p:
            return ids, row[ids], probs
        margin *= 2


def _draw_whole_row(row: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """A draw with temperature alone (no top-k, top-p 1, min-p 0): every token is a candidate, so
    nothing is sorted -- one pass over the row in vocabulary order, where the nucleus search would
    sort all 262k entries (tens of ms a row on the batcher thread, a stall any caller could ask for)."""
    scaled = row.astype(np.float64) / temperature
    cdf = np.cumsum(np.exp(scaled - scaled.max()))  # masked (-inf) entries weigh 0
    return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), cdf.size - 1)


def _draw(row: np.ndarray, spec: RowSpec) -> int:
    """Top-k / top-p / min-p / temperature / draw for one row with temperature > 0."""
    if spec.top_k <= 0 and spec.top_p >= 1.0 and spec.min_p <= 0.0:
        return _draw_whole_row(row, spec.temperature, spec.rng)
    if spec.top_k > 0:
        vals, ids = top_candidates(row, spec.top_k)
        denom = float(np.logaddexp.reduce(vals.astype(np.float64)))  # top-p over the top-k survivors
        keep = _kept(np.exp(vals.astype(np.float64) - denom), spec)
        vals, ids = vals[keep], ids[keep]
    else:
        vals, ids = _nucleus(row, spec)
    kept = vals.astype(np.float64) / spec.temperature
    weights = np.exp(kept - kept.max())  # no overflow
    cdf = np.cumsum(weights)
    pick = min(int(np.searchsorted(cdf, spec.rng.random() * cdf[-1])), cdf.size - 1)
    return int(ids[pick])


@dataclass(slots=True)
class Sampled:
    """One step's choices: a token per row, and for rows that asked, its log-probability under
    the raw distribution and the ``top_logprobs`` most likely ``(token, logprob)`` pairs."""

    tokens: list[int]
    logprobs: list[float | None]
    top: list[list[tuple[int, float]]]


def sample(logits: np.ndarray, specs: list[RowSpec]) -> Sampled:
    """Choose one token per row of ``logits`` ([rows, vocab] float32, adjusted in place)."""
    if not any(s.adjusted or s.want_logprob or not s.greedy for s in specs):
        return Sampled(logits.argmax(axis=1).tolist(), [None] * len(specs), [[] for _ in specs])
    tokens: list[int] = []
    logprobs: list[float | None] = []
    top: list[list[tuple[int, float]]] = []
    for row, spec in zip(logits, specs):
        raw = row.copy() if spec.adjusted and spec.want_logprob else row  # logprobs are the raw model's
        if spec.adjusted:
            _adjust(row, spec)
        token = int(row.argmax()) if spec.greedy else _draw(row, spec)
        tokens.append(token)
        if not spec.want_logprob:
            logprobs.append(None)
            top.append([])
            continue
        lse = log_sum_exp(raw)
        logprobs.append(float(raw[token]) - lse)
        if spec.top_logprobs > 0:
            vals, ids = top_candidates(raw, spec.top_logprobs)
            top.append([(int(t), float(v) - lse) for t, v in zip(ids, vals)])
        else:
            top.append([])
    return Sampled(tokens, logprobs, top)
