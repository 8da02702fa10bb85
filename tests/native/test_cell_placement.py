"""Where a prompt's cells lie in llama.cpp's KV cache. The kept cells' rent
(``scheduling/cell_rent.py``) frees cached prefixes between live ones, so a later prompt may be laid
across the holes they leave. With flash attention its logits are bit for bit those it has in
contiguous cells; without, they are not -- which is why ``Config.cell_rent`` is off by default with
flash attention off (a prompt scored alone would no longer equal llama-cpp-python's). Even with flash
attention, a running sequence whose next token falls into a hole below its earlier cells gets other
numbers (the kernel accumulates in cell order, in f16): so with the rent on, a stream's log-probabilities
depend on when the rent let entries go, which follows measured step times."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from llamactor.native.engine import Engine

from tests.conftest import decode_prompt

PROMPT = "Question: Which animal says moo and gives milk on the farm?\nAnswer: The"


@contextmanager
def small_engine(model_path: str, flash_attn: str) -> Iterator[Engine]:
    engine = Engine(model_path, n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=8, n_threads=2, flash_attn=flash_attn)
    try:
        yield engine
    finally:
        engine.close()


def filler(engine: Engine, n: int) -> list[int]:
    """``n`` tokens of text that is neither the prompt nor its continuation."""
    return (engine.tokenizer.tokenize("the weather at sea was calm and grey", add_special=False) * 20)[:n]


def logits_contiguous_and_across_holes(model_path: str, flash_attn: str) -> tuple[np.ndarray, np.ndarray]:
    """The prompt's last logits row in an empty cache, then in one whose cells 0-4, 15-17 and 28-30
    are free between live sequences (llama.cpp fills the lowest free cells first)."""
    with small_engine(model_path, flash_attn) as engine:
        tokens = engine.tokenizer.tokenize(PROMPT)
        alone = decode_prompt(engine, 0, tokens)
        engine.clear()
        for seq_id, n in [(1, 5), (2, 10), (3, 3), (4, 10), (5, 3), (6, 100)]:
            engine.prefill(seq_id, filler(engine, n))
        for seq_id in (1, 3, 5):
            engine.seq_rm(seq_id)
        return alone, decode_prompt(engine, 0, tokens)


def test_with_flash_attention_a_prompt_laid_across_holes_has_the_logits_it_has_in_contiguous_cells(
        model_path: str) -> None:
    alone, across = logits_contiguous_and_across_holes(model_path, "on")
    assert np.array_equal(alone, across)


def test_without_flash_attention_the_cells_a_prompt_lies_in_move_its_logits(model_path: str) -> None:
    alone, across = logits_contiguous_and_across_holes(model_path, "off")
    assert not np.array_equal(alone, across)  # if llama.cpp ever makes this exact, the rent may go on here too


def next_tokens_logits(model_path: str, below: str) -> list[np.ndarray]:
    """The prompt's next four tokens' logits, decoded one a step, with nothing ``below`` the prompt's
    cells, an 8-cell entry ``kept`` there, or one ``freed`` after the prompt was laid above it (so
    llama.cpp lays the four tokens in cells below the prompt's)."""
    with small_engine(model_path, "on") as engine:
        tokens = engine.tokenizer.tokenize(PROMPT)
        if below != "nothing":
            engine.prefill(1, filler(engine, 8))
        engine.prefill(0, tokens)
        if below == "freed":
            engine.seq_rm(1)
        steps = engine.tokenizer.tokenize(" cow gives us milk", add_special=False)[:4]
        return [decode_prompt(engine, 0, [t], n_past=len(tokens) + i) for i, t in enumerate(steps)]


def test_with_flash_attention_a_running_sequences_token_laid_in_a_hole_below_it_moves_its_logits(
        model_path: str) -> None:
    alone = next_tokens_logits(model_path, "nothing")
    assert all(np.array_equal(a, b) for a, b in zip(alone, next_tokens_logits(model_path, "kept")))
    assert not all(np.array_equal(a, b) for a, b in zip(alone, next_tokens_logits(model_path, "freed")))
