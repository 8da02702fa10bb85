"""Draft tokens for speculative decoding: what a sequence is expected to say next, without a model.

Two drafters, both cheap enough to ask every step (docs/architecture.md, *Speculation*):

- ``PredictionDrafter`` drafts from a caller's prediction (OpenAI's Predicted Outputs): the
  prediction's tokens after where the output currently is in it. When the output leaves the
  prediction (the edit an editor asked for), it re-anchors: the longest recent suffix of the output
  that occurs in the prediction, nearest after where it left, says where the output rejoined it, so
  the rest of a file after a small edit still drafts. The output's tokens at the edit's boundary may
  be split differently from the prediction's, so a short suffix (down to one token, just after where
  it left) also anchors.
- ``NgramDrafter`` is prompt lookup (llama.cpp's lookup decoding, vLLM's ngram method): the longest
  suffix of the sequence (``max_ngram`` tokens down to ``min_ngram``) that occurred earlier in its
  prompt or output proposes what followed its most recent occurrence. An index of each n-gram's
  last position is kept up to date as tokens arrive, so a step costs a few dict look-ups even on
  long sequences.

Both adapt (``Adaptivity``): a running estimate of the chance that a drafted token is accepted
(the budget's input, ``llamactor.scheduling.draft_budget``), and a back-off: a drafter whose
proposals keep being rejected outright rests for a growing number of steps, probing again after
each rest.

Pure: the batcher thread owns each drafter (one per drafting sequence) and calls it once per step.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

# A suffix this long that occurs in the prediction anchors anywhere in it; shorter ones only just
# after where the output left the prediction (a token or two match by chance too easily).
SURE_ANCHOR = 3
LONGEST_ANCHOR = 8  # longer suffixes say no more about where the output is
ANCHOR_WINDOW = 32  # how far after where the output left a short suffix may anchor
ANCHOR_CANDIDATES = 256  # occurrences of a common bigram looked at, nearest first

# Back-off: this many proposals in a row with nothing accepted make the drafter rest.
FAIL_STREAK = 3
FIRST_REST = 4  # steps; each failed probe doubles it
LONGEST_REST = 256
# The acceptance estimate: decayed counts, forgetting over about this many observations.
MEMORY = 16.0
PRIOR_WEIGHT = 4.0  # the prior counts as this many drafted positions (it decays like them)
PREDICTION_PRIOR = 0.9  # a caller's prediction is mostly right: that is why it was sent
NGRAM_PRIOR = 0.5


class Drafter(Protocol):
    def propose(self, tokens: Sequence[int], n_prompt: int, k: int) -> list[int]:
        """Up to ``k`` tokens expected to follow ``tokens`` (the prompt's ``n_prompt`` and every
        token generated so far); [] when there is nothing to propose or the drafter is resting."""
        ...

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """What the step made of the last proposal (0 <= n_accepted <= n_drafted)."""
        ...

    @property
    def acceptance(self) -> float:
        """The estimated chance (0..1) that a drafted token is accepted, given those before it were."""
        ...

    @property
    def unproven(self) -> bool:
        """Whether none of its drafted tokens has been accepted yet (the estimate is still its prior's)."""
        ...


def make_drafter(mode: str, prediction: Sequence[int] | None) -> Drafter | None:
    """The drafter a request's sampling asks for: the prediction's when there is one (tokenized,
    no BOS), else n-gram prompt lookup when ``mode == "ngram"``, else None."""
    if prediction:
        return PredictionDrafter(prediction)
    if mode == "ngram":
        return NgramDrafter()
    return None


class Adaptivity:
    """A drafter's acceptance estimate and back-off (batcher thread).

    The estimate is the geometric model's: each verified draft position is a trial that ends the
    run when it fails, so accepted / (accepted + rejections) is the chance per token that the
    budget's ``acceptance ** i`` expects."""

    def __init__(self, prior: float) -> None:
        self.accepted = prior * PRIOR_WEIGHT
        self.trials = PRIOR_WEIGHT
        self.fail_streak = 0
        self.rest = FIRST_REST  # the next rest's length
        self.resting_steps = 0
        self.probing = False
        self.unproven = True

    @property
    def acceptance(self) -> float:
        return min(1.0, self.accepted / self.trials) if self.trials > 0 else 0.0

    def resting(self) -> bool:
        """True while the drafter rests this step (each call is one step)."""
        if self.resting_steps > 0:
            self.resting_steps -= 1
            return True
        return False

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        if not 0 <= n_accepted <= n_drafted:
            raise ValueError(f"accepted {n_accepted} of {n_drafted} drafted tokens")
        if n_drafted == 0:
            return  # the budget verified none: nothing learned
        keep = 1 - 1 / MEMORY
        self.accepted = self.accepted * keep + n_accepted
        self.trials = self.trials * keep + n_accepted + (n_accepted < n_drafted)
        if n_accepted:
            self.fail_streak, self.rest, self.probing, self.unproven = 0, FIRST_REST, False, False
            return
        self.fail_streak += 1
        if self.probing or self.fail_streak >= FAIL_STREAK:
            self._rest()

    def _rest(self) -> None:
        """Rest ``rest`` steps, then probe once; a failed probe rests twice as long."""
        self.resting_steps = self.rest
        self.rest = min(2 * self.rest, LONGEST_REST)
        self.fail_streak, self.probing = 0, True


class PredictionDrafter(Adaptivity):
    """Drafts a prediction's tokens after where the output is in it (batcher thread); adapts as
    ``Adaptivity`` (``observe``, ``acceptance``)."""

    def __init__(self, prediction: Sequence[int]) -> None:
        self.prediction = list(prediction)
        super().__init__(PREDICTION_PRIOR)
        self.seen = 0  # output tokens walked so far
        self.position: int | None = 0  # where the next output token is expected in the prediction
        self.left_at = 0  # where the output last was in the prediction
        self._bigrams: dict[tuple[int, int], list[int]] | None = None  # built at the first re-anchor

    def propose(self, tokens: Sequence[int], n_prompt: int, k: int) -> list[int]:
        output = tokens[n_prompt:]
        self._follow(output)
        if self.resting() or k <= 0:
            return []
        if self.position is None:
            self.position = self._anchor(output)
            if self.position is None:
                return []
            self.left_at = self.position
        return self.prediction[self.position:self.position + k]

    def _follow(self, output: Sequence[int]) -> None:
        """Walk the output tokens new since the last call along the prediction."""
        if len(output) < self.seen:  # a restarted request: walk again from its start
            self.seen, self.position, self.left_at = 0, 0, 0
        prediction = self.prediction
        for token in output[self.seen:]:
            at = self.position
            if at is not None and at < len(prediction) and prediction[at] == token:
                self.position = self.left_at = at + 1
            else:
                self.position = None
        self.seen = len(output)

    def _anchor(self, output: Sequence[int]) -> int | None:
        """Where in the prediction the output's latest tokens continue, or None."""
        if not output:
            return None
        suffix = list(output[-LONGEST_ANCHOR:])
        sure = self._sure_anchor(suffix)
        return sure if sure is not None else self._near_anchor(suffix)

    def _sure_anchor(self, suffix: list[int]) -> int | None:
        """The end of the nearest occurrence (after ``left_at`` first) of the longest suffix of at
        least ``SURE_ANCHOR`` tokens (fewer when the output is that short)."""
        if len(suffix) < 2:
            return None
        ends = self._bigram_ends(suffix[-2], suffix[-1])
        need = min(SURE_ANCHOR, len(suffix))
        best: tuple[int, int] | None = None  # (matched length, end)
        for end in self._nearest_first(ends):
            length = self._match_length(suffix, end)
            if length >= need and (best is None or length > best[0]):
                best = (length, end)
                if length == len(suffix):
                    break
        return None if best is None else best[1]

    def _near_anchor(self, suffix: list[int]) -> int | None:
        """Just after where the output left the prediction: the end of the first match of the
        output's last token (the rejoin may be split differently from the prediction)."""
        prediction, last = self.prediction, suffix[-1]
        stop = min(len(prediction), self.left_at + ANCHOR_WINDOW)
        for at in range(self.left_at, stop):
            if prediction[at] == last:
                return at + 1
        return None

    def _bigram_ends(self, first: int, second: int) -> list[int]:
        """The sorted positions just after each occurrence of ``first, second`` in the prediction."""
        if self._bigrams is None:
            self._bigrams = {}
            p = self.prediction
            for at in range(len(p) - 1):
                self._bigrams.setdefault((p[at], p[at + 1]), []).append(at + 2)
        return self._bigrams.get((first, second), [])

    def _nearest_first(self, ends: list[int]) -> list[int]:
        """Up to ``ANCHOR_CANDIDATES`` of ``ends``: those at or after ``left_at`` ascending, then
        those before it descending."""
        split = bisect.bisect_left(ends, self.left_at)
        after = ends[split:split + ANCHOR_CANDIDATES]
        before = ends[max(0, split - (ANCHOR_CANDIDATES - len(after))):split][::-1]
        return after + before

    def _match_length(self, suffix: list[int], end: int) -> int:
        """How many of ``suffix``'s last tokens equal the prediction's tokens before ``end``."""
        prediction, length = self.prediction, 0
        while length < len(suffix) and length < end and prediction[end - 1 - length] == suffix[-1 - length]:
            length += 1
        return length


class NgramDrafter(Adaptivity):
    """Prompt lookup: the continuation of the latest earlier occurrence of the sequence's longest
    recurring suffix (batcher thread); adapts as ``Adaptivity``."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"bad n-gram sizes {min_ngram}..{max_ngram}")
        self.sizes = range(max_ngram, min_ngram - 1, -1)
        super().__init__(NGRAM_PRIOR)
        # n-gram -> the position just after its latest occurrence that has a token after it
        self.index: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # the index holds the n-grams ending at positions <= indexed

    def propose(self, tokens: Sequence[int], n_prompt: int, k: int) -> list[int]:
        self._index(tokens)
        if self.resting() or k <= 0:
            return []
        n = len(tokens)
        for size in self.sizes:
            if size > n:
                continue
            end = self.index.get(tuple(tokens[n - size:]))
            if end is not None:
                return list(tokens[end:min(end + k, n)])
        return []

    def _index(self, tokens: Sequence[int]) -> None:
        """Index every n-gram that ends before the last token (so it has a continuation)."""
        if len(tokens) - 1 < self.indexed:  # a restarted request: index again from its start
            self.index.clear()
            self.indexed = 0
        for end in range(self.indexed + 1, len(tokens)):
            for size in self.sizes:
                if size <= end:
                    self.index[tuple(tokens[end - size:end])] = end
        self.indexed = max(self.indexed, len(tokens) - 1)
