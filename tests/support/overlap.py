"""Shared by the overlapped-loop tests (test_overlapped_steps.py, test_planned_steps.py): a serial
tree and an overlapped one with the same options, and what "the same completion" means there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import llamactor


def same(a: llamactor.Completion, b: llamactor.Completion) -> bool:
    """The same tokens, text, end and log-probabilities."""
    return (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason) and \
        [lp.logprob for lp in a.logprobs or ()] == [lp.logprob for lp in b.logprobs or ()]


def serial_and_overlapped(start_llm: Callable[..., llamactor.LLM], **options: Any) -> tuple[llamactor.LLM, llamactor.LLM]:
    """Two trees, the serial loop's and the overlapped one's (forced on: this CPU decodes synchronously).
    Both without the kept cells' rent: it lets entries go by measured step times, so the two trees
    would free different cells, and a stream's next token laid in a freed cell below its others gets
    other numbers (tests/native/test_cell_placement.py), whichever loop runs it."""
    options.setdefault("prefix_cache_rent", False)
    return (start_llm(overlap_steps=False, max_restarts=0, **options),
            start_llm(overlap_steps=True, max_restarts=0, **options))
