"""The overlapped loop's pure rules (batcher thread): whether it is on, which steps it postprocesses
in full before the next plan, which drawn tokens surely end their request, and how a step's rows
and draws are split when sequences ended meanwhile (docs/architecture.md, *Overlapped steps*)."""

from __future__ import annotations

import dataclasses
from typing import Any

from llamactor.base.config import Config
from llamactor.scheduling.sequence import Sequence, StepPlan
from llamactor.tree.output_rows import OutputRows
from llamactor.tree.token_draw import Draw, StepResult


def overlap_on(config: Config, decodes_async: bool) -> bool:
    """Whether the batcher overlaps its steps: as configured, else where the decode is
    asynchronous; never in batch-invariant mode (its guarantees are verified for the serial loop)."""
    if config.batch_invariant:
        return False
    return decodes_async if config.overlap_steps is None else config.overlap_steps


def needs_postprocess_first(plan: StepPlan, result: StepResult) -> bool:
    """Whether the plan after this step depends on more of its postprocess than its tokens: prompt
    scores and label rows (read from logits the next launch overwrites), draws that raised,
    sequences that found no KV room, prompt-only sequences (nothing left to plan once done), and
    drafted rows (their verification reads rows the next launch overwrites, and its ``seq_rm`` of
    rejected cells must come before the next decode)."""
    return bool(result.rows.scored or result.rows.label_rows or result.rows.drafted or result.draw.refused
                or result.decoded.failed_seq_ids or any(c.seq.prompt_only for c in plan.chunks))


def ends_with(seq: Sequence, token: int, tokenizer: Any, n_ctx_seq: int) -> bool:
    """Whether accepting ``token`` will surely end ``seq`` (EOG, max_tokens, the context): such a
    sequence is postprocessed before the next plan, so it wastes no row, and its seq_id and cells
    go to the next step as in the serial loop. (A stop string or a cancel is known only in
    postprocess: its row is dropped.)"""
    return (tokenizer.is_eog(token) and not seq.state.params.ignore_eos) or ends_by_length(seq, n_ctx_seq)


def ends_by_length(seq: Sequence, n_ctx_seq: int) -> bool:
    """Whether the next token ``seq`` accepts ends it, whatever the token: max_tokens, the context."""
    params = seq.state.params
    if params.max_tokens is not None and seq.state.n_generated + 1 >= params.max_tokens:
        return True
    return len(seq.token_ids) + 1 >= n_ctx_seq


def without(rows: OutputRows, dropped: set[Sequence], failed_seq_ids: frozenset[int]) -> OutputRows:
    """``rows`` less the rows of ``dropped`` sequences and of those the decode found no room for."""
    def keep(seq: Sequence) -> bool:
        return seq not in dropped and seq.seq_id not in failed_seq_ids
    pairs = [(r, s) for r, s in zip(rows.sample_rows, rows.to_sample) if keep(s)]
    return OutputRows(scored=[(c, r) for c, r in rows.scored if keep(c.seq)],
                      sample_rows=[r for r, _ in pairs], to_sample=[s for _, s in pairs],
                      label_rows=[(s, r) for s, r in rows.label_rows if keep(s)],
                      drafted={s: d for s, d in rows.drafted.items() if keep(s)})


def split_draw(draw: Draw, apart: list[bool]) -> tuple[Draw, Draw]:
    """``draw``'s tokens set ``apart`` (a flag per token), and the rest (with the counts and refusals)."""
    def part(keep: list[int], whole: bool) -> Draw:
        sampled = dataclasses.replace(draw.sampled, tokens=[draw.sampled.tokens[i] for i in keep],
                                      logprobs=[draw.sampled.logprobs[i] for i in keep],
                                      top=[draw.sampled.top[i] for i in keep])
        return Draw([draw.seqs[i] for i in keep], sampled, draw.n_in_graph if whole else 0,
                    draw.refused if whole else [])
    return (part([i for i, a in enumerate(apart) if a], False),
            part([i for i, a in enumerate(apart) if not a], True))
