"""The sampling part of a generation step's ``run`` (batcher thread): each sampling row's token,
and the ``StepResult`` that ``run`` hands ``postprocess``.

A row's token is the one llama.cpp drew in the graph, or the host sampler's (``sample_rows``).
When the step's draw raises, each row is drawn again on its own, and a sequence whose own row
raises is set apart (``Draw.refused``) to end alone in ``postprocess``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llamactor.base.errors import LlamactorError
from llamactor.native.engine import DecodeResult
from llamactor.native.sampling import Sampled
from llamactor.scheduling.sequence import Sequence
from llamactor.tree.grammar_sampler import GrammarSampler
from llamactor.tree.graph_chains import sample_rows
from llamactor.tree.output_rows import OutputRows
from llamactor.tree.request_state import request_error, shared


@dataclass(slots=True)
class Draw:
    """One step's tokens: ``sampled`` holds a row per sequence of ``seqs``, in order."""

    seqs: list[Sequence] = field(default_factory=list)
    sampled: Sampled = field(default_factory=lambda: Sampled([], [], []))
    n_in_graph: int = 0  # tokens llama.cpp drew inside the graph
    refused: list[tuple[Sequence, LlamactorError]] = field(default_factory=list)  # their own draw raised


@dataclass(slots=True)
class StepResult:
    """What ``run`` returns and ``postprocess`` takes: all that passes between them."""

    decoded: DecodeResult
    rows: OutputRows  # laid out before ``n_past`` moved on
    draw: Draw


def draw_tokens(sampler: GrammarSampler, decoded: DecodeResult, rows: OutputRows) -> Draw:
    """Draw the token of each of ``rows``' sampling rows from ``decoded``."""
    if not rows.to_sample:
        return Draw()
    logits = decoded.logits if len(rows.sample_rows) == len(decoded.logits) else decoded.logits[rows.sample_rows]
    graph_tokens = None if decoded.tokens is None else decoded.tokens[rows.sample_rows]
    try:
        sampled, n_in_graph = sample_rows(sampler, rows.to_sample, logits, graph_tokens)
    except Exception as e:
        if shared(e):
            raise
        return _draw_apart(sampler, rows.to_sample, logits, graph_tokens)
    return Draw(rows.to_sample, sampled, n_in_graph)


def _draw_apart(sampler: GrammarSampler, to_sample: list[Sequence], logits: np.ndarray,
                graph_tokens: np.ndarray | None) -> Draw:
    """The step's draw raised: draw each row again on its own, setting apart each sequence whose
    own row raises. (A bug's path: the draws may differ from an undisturbed run's.)"""
    out = Draw()
    for i, seq in enumerate(to_sample):
        try:
            one, n = sample_rows(sampler, [seq], logits[i:i + 1], None if graph_tokens is None else graph_tokens[i:i + 1])
        except Exception as e:
            if shared(e):
                raise
            out.refused.append((seq, request_error(seq.request, e, "sampling its token")))
            continue
        out.seqs.append(seq)
        out.sampled.tokens += one.tokens
        out.sampled.logprobs += one.logprobs
        out.sampled.top += one.top
        out.n_in_graph += n
    return out
