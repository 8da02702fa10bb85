"""Where a prompt's cells lie in llama.cpp's KV cache. The kept cells' rent
(``scheduling/cell_rent.py``) frees cached prefixes between live ones, so a later prompt may be laid
across the holes they leave. With flash attention its logits are bit for bit those it has in
contiguous cells; without, they are not -- which is why ``Config.cell_rent`` is off by default with
flash attention off (a prompt scored alone would no longer equal llama-cpp-python's)."""

from __future__ import annotations

import numpy as np

from llamactor.native.engine import Engine

from tests.conftest import decode_prompt

PROMPT = "Question: Which animal says moo and gives milk on the farm?\nAnswer: The"


def logits_contiguous_and_across_holes(model_path: str, flash_attn: str) -> tuple[np.ndarray, np.ndarray]:
    """The prompt's last logits row in an empty cache, then in one whose cells 0-4, 15-17 and 28-30
    are free between live sequences (llama.cpp fills the lowest free cells first)."""
    engine = Engine(model_path, n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=8, n_threads=2, flash_attn=flash_attn)
    try:
        tokens = engine.tokenizer.tokenize(PROMPT)
        alone = decode_prompt(engine, 0, tokens)
        engine.clear()
        filler = engine.tokenizer.tokenize("the weather at sea was calm and grey", add_special=False)
        for seq_id, n in [(1, 5), (2, 10), (3, 3), (4, 10), (5, 3), (6, 100)]:
            engine.prefill(seq_id, (filler * 20)[:n])
        for seq_id in (1, 3, 5):
            engine.seq_rm(seq_id)
        return alone, decode_prompt(engine, 0, tokens)
    finally:
        engine.close()


def test_with_flash_attention_a_prompt_laid_across_holes_has_the_logits_it_has_in_contiguous_cells(
        model_path: str) -> None:
    alone, across = logits_contiguous_and_across_holes(model_path, "on")
    assert np.array_equal(alone, across)


def test_without_flash_attention_the_cells_a_prompt_lies_in_move_its_logits(model_path: str) -> None:
    alone, across = logits_contiguous_and_across_holes(model_path, "off")
    assert not np.array_equal(alone, across)  # if llama.cpp ever makes this exact, the rent may go on here too
