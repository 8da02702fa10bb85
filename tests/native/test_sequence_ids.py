"""Sequence ids per model on the real engines: shadow ids only where a sliding window needs them.

Gemma 3 (sliding-window layers) gives every sequence a shadow id and so holds at most 128; SmolLM2
(llama architecture, none) holds all 256 of llama.cpp's ids, its KV operations and saved states
working on the sequence's own id alone (docs/architecture.md, *The prefix cache*, "Sliding window")."""

from __future__ import annotations

import numpy as np
import pytest

from llamactor.base.errors import ModelLoadError, SequenceLimitError
from llamactor.native.engine import Engine
from llamactor.native.graph_sampling import TOKEN_NULL, ChainParams, GraphChain

from tests.conftest import decode_prompt


def test_a_model_without_sliding_window_layers_holds_all_256_ids_without_shadows(instruct_path: str) -> None:
    e = Engine(instruct_path, n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=256, n_threads=2)
    try:
        assert e.n_swa == 0 and not e.info.shadow_ids and e.info.n_seq_max == 256
        tokens = e.tokenizer.tokenize("The lighthouse keeper climbed the stairs every night to light the")
        e.prefill(255, tokens[:-1])  # the last id is a sequence's own, no shadow's
        e.seq_cp(255, 7)
        assert (e.seq_pos_min(7), e.seq_pos_max(7)) == (0, len(tokens) - 2)
        e.seq_rm(255)
        assert e.seq_pos_max(255) == -1 and e.seq_pos_max(7) == len(tokens) - 2  # the cells stay with 7
        state = e.save_seq(7, len(tokens) - 1)
        assert state.windows == ()
        assert e.restore_seq(200, state, scratch_id=201)
        assert (e.seq_pos_min(200), e.seq_pos_max(200)) == (0, len(tokens) - 2) and e.seq_pos_max(201) == -1
        # one row each, decoded alike: a restored state gives the very logits of the one it was saved from
        restored = decode_prompt(e, 200, tokens[-1:], n_past=len(tokens) - 1)
        original = decode_prompt(e, 7, tokens[-1:], n_past=len(tokens) - 1)
        assert np.array_equal(restored, original)
    finally:
        e.close()


def test_a_model_with_sliding_window_layers_keeps_its_shadow_ids_and_refuses_more_than_128(model_path: str) -> None:
    e = Engine(model_path, n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=128, n_threads=2)
    try:
        assert e.n_swa > 0 and e.info.shadow_ids and e.info.n_seq_max == 128
    finally:
        e.close()
    with pytest.raises(SequenceLimitError, match=r"gemma.*holds at most 128 sequence ids.*shadow id.*n_seq_max=129"):
        Engine(model_path, n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=129, n_threads=2)


def test_a_sequence_count_function_gets_the_models_most(model_path: str, instruct_path: str) -> None:
    asked: list[tuple[int, str]] = []

    def seq_ids(most: int, model: str) -> int:
        asked.append((most, model))
        return 2

    for path in (model_path, instruct_path):
        Engine(path, n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=seq_ids, n_threads=2).close()
    assert [most for most, _ in asked] == [128, 256] and asked[1][1] == instruct_path.rsplit("/", 1)[-1]
    assert issubclass(SequenceLimitError, ModelLoadError)


def test_a_row_sampled_in_the_graph_needs_no_shadow_on_a_model_without_sliding_window_layers(
        instruct_path: str) -> None:
    e = Engine(instruct_path, n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=256, n_threads=2, graph_sampling=True)
    chain = GraphChain(ChainParams(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05), e.n_vocab)
    try:
        assert e.graph_sampling
        tokens = e.tokenizer.tokenize("The lighthouse keeper climbed the stairs every night to light the")
        for seq_id in (3, 250):
            e.prefill(seq_id, tokens[:-1])
        e.attach_chain(250, chain)  # 250: an id a context with shadows could not have
        n = len(tokens)
        result = e.decode(np.full(2, tokens[-1], np.int32), np.full(2, n - 1, np.int32), np.array([3, 250], np.int32),
                          np.ones(2, np.int8))
        assert result.tokens is not None and int(result.tokens[0]) == TOKEN_NULL
        assert int(result.tokens[1]) == int(np.argmax(result.logits[0]))  # greedy in the graph, as on the host
        e.attach_chain(250, None)
        e.seq_rm(250, 0, 4)  # the KV operations after graph rows: nothing for a shadow to catch up with
        assert (e.seq_pos_min(250), e.seq_pos_max(250)) == (4, n - 1)
    finally:
        e.attach_chain(250, None)
        chain.free()
        e.close()
