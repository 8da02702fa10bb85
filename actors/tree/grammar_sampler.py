"""The batcher's side of structured output: a matcher per constrained request, and sampling a
whole step with each constrained row under its grammar (batcher thread only).

The caller's side -- compiling and checking a ``Grammar`` -- is ``llamactor.base.grammar``.
"""

from __future__ import annotations

import dataclasses
import time

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np

from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.native.sampling import RowSpec, Sampled, sample


def new_matcher(grammar: Grammar, tokenizer: llguidance.LLTokenizer) -> llguidance.LLMatcher:
    """The parser state of one request; ``InvalidRequestError`` if the grammar does not build
    against this model's vocabulary (rare once ``Grammar`` checked it)."""
    matcher = llguidance.LLMatcher(tokenizer, grammar.compiled, log_level=0)
    if matcher.is_error():
        raise InvalidRequestError(f"invalid {grammar.kind}: {matcher.get_error()}")
    return matcher


class GrammarSampler:
    """Samples one step's rows, each constrained row under its grammar (batcher thread).

    llama.cpp's order of work: every row is first drawn from its unmasked distribution, and a
    constrained row's token is checked against its grammar (microseconds); only a row whose token
    the grammar refuses computes its full mask and is drawn again under it. Greedy rows get
    exactly the masked argmax. A sampled row gets the distribution restricted to what the grammar
    allows (sampling filters applied before the restriction; after it, on a redraw).

    Full masks are the expensive part: 0.1 ms in JSON structure, but 1-3 ms inside a string with
    a length limit, over Gemma's 262k-token vocabulary. They are computed one by one, not in
    llguidance's thread pool: on 2 cores its threads keep spinning after the work and slowed the
    next ``llama_decode``.
    """

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._buffer = llg_numpy.allocate_token_bitmask(1, n_vocab)
        self.mask_ms = 0.0  # cumulative, for the step profile
        self.n_masked = 0  # rows drawn again under their full mask
        self.n_checked = 0  # constrained rows drawn

    def sample(self, logits: np.ndarray, specs: list[RowSpec], matchers: list[llguidance.LLMatcher | None]) -> Sampled:
        constrained = [i for i, m in enumerate(matchers) if m is not None]
        # sample() adjusts rows in place; a redraw needs the logits from before bias and penalties.
        kept = {i: logits[i].copy() for i in constrained if specs[i].logit_bias or specs[i].penalised}
        first = sample(logits, specs)
        self.n_checked += len(constrained)
        refused = [i for i in constrained if matchers[i].validate_tokens([first.tokens[i]]) != 1]  # type: ignore[union-attr]
        if not refused:
            return first
        start = time.perf_counter()
        if self._buffer.shape[0] < len(refused):
            self._buffer = llg_numpy.allocate_token_bitmask(len(refused), self.n_vocab)
        for j, i in enumerate(refused):
            llg_numpy.fill_next_token_bitmask(matchers[i], self._buffer, j)  # type: ignore[arg-type]
        self.mask_ms += (time.perf_counter() - start) * 1000
        self.n_masked += len(refused)
        rows = np.stack([kept.get(i, logits[i]) for i in refused])
        redraw_specs = [dataclasses.replace(specs[i], allowed=self._buffer[j]) for j, i in enumerate(refused)]
        again = sample(rows, redraw_specs)
        for j, i in enumerate(refused):
            first.tokens[i], first.logprobs[i], first.top[i] = again.tokens[j], again.logprobs[j], again.top[j]
        return first
