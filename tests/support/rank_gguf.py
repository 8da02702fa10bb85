"""Tiny ranking-head GGUFs for the tests: random weights, pooling type rank; BERT, and qwen3.

What a converted cross-encoder (bge-reranker, ms-marco-MiniLM) is to llama.cpp, at 16 dimensions:
non-causal attention (``bert.attention.causal`` false, else rank pooling would read the last token,
not [CLS]), the pooler (``cls``, dense + tanh) and the score projection (``cls.output``, one label
unless asked for more), a WordPiece vocabulary whose words carry the phantom-space prefix ``▁``
(without it llama.cpp's WPM tokenizer maps every word to [UNK]) and ``token_type_count`` 2 (the
BERT loader refuses 0). Optionally the ``tokenizer.chat_template.rerank`` template llama-server
reads. Its scores mean nothing; they only have to equal llama-cpp-python's for the same file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(len(SPECIALS))
WORDS = ("the", "cat", "dog", "sat", "on", "mat", "paris", "capital", "france", "is", "what", "of", "a", "city",
         "in", "river", ".", "?", ",")
N_CTX_TRAIN = 128
_E, _FF, _LAYERS, _HEADS = 16, 32, 1, 2


def write_rank_gguf(path: Path, *, template: str | None = None, labels: tuple[str, ...] = ("LABEL_0",),
                    arch: str = "bert", seed: int = 0) -> Path:
    """A ranking GGUF at ``path`` (about 20 KB): ``labels`` name its output labels (their count is
    ``n_cls_out``); ``template``: its ``rerank`` template, with ``{query}`` and ``{document}``."""
    writer = gguf.GGUFWriter(str(path), arch)
    _hyperparameters(writer, labels)
    _vocabulary(writer, template)
    _tensors(writer, np.random.default_rng(seed), len(SPECIALS) + len(WORDS), len(labels))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _hyperparameters(writer: gguf.GGUFWriter, labels: tuple[str, ...]) -> None:
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(_E)
    writer.add_feed_forward_length(_FF)
    writer.add_block_count(_LAYERS)
    writer.add_head_count(_HEADS)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(list(labels))


def _vocabulary(writer: gguf.GGUFWriter, template: str | None) -> None:
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([*SPECIALS, *("\u2581" + w for w in WORDS)])
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * len(WORDS))
    writer.add_token_type_count(2)
    writer.add_pad_token_id(PAD)
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(CLS)
    writer.add_sep_token_id(SEP)
    writer.add_mask_token_id(MASK)
    if template is not None:
        writer.add_chat_template([{"name": "rerank", "template": template}])


def _tensors(writer: gguf.GGUFWriter, rng: np.random.Generator, n_vocab: int, n_labels: int) -> None:
    """BERT's tensors (numpy shapes are ggml's ``ne`` reversed)."""
    def random(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    def norm(name: str) -> None:
        writer.add_tensor(name + ".weight", np.ones(_E, np.float32))
        writer.add_tensor(name + ".bias", np.zeros(_E, np.float32))

    random("token_embd.weight", n_vocab, _E)
    random("token_types.weight", 2, _E)
    random("position_embd.weight", N_CTX_TRAIN, _E)
    norm("token_embd_norm")
    for i in range(_LAYERS):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            random(f"blk.{i}.{name}.weight", _E, _E)
            random(f"blk.{i}.{name}.bias", _E)
        norm(f"blk.{i}.attn_output_norm")
        random(f"blk.{i}.ffn_up.weight", _FF, _E)
        random(f"blk.{i}.ffn_up.bias", _FF)
        random(f"blk.{i}.ffn_down.weight", _E, _FF)
        random(f"blk.{i}.ffn_down.bias", _E)
        norm(f"blk.{i}.layer_output_norm")
    random("cls.weight", _E, _E)
    random("cls.bias", _E)
    random("cls.output.weight", n_labels, _E)
    random("cls.output.bias", n_labels)


def write_qwen3_rank_gguf(path: Path, seed: int = 0) -> Path:
    """A ranking GGUF of the qwen3 architecture, as ``convert_hf_to_gguf`` writes a Qwen3-Reranker:
    causal (rank pooling reads the last token), ``cls.output`` with the labels ["yes", "no"], and
    llama.cpp's graph ends in a softmax over them. Byte-level BPE vocabulary (the 256 byte tokens,
    one merge, ChatML's special tokens); random weights, 16 dimensions, one layer."""
    rng = np.random.default_rng(seed)
    heads, head_dim = 2, _E // 2
    writer = gguf.GGUFWriter(str(path), "qwen3")
    for add, value in ((writer.add_context_length, N_CTX_TRAIN), (writer.add_embedding_length, _E),
                       (writer.add_feed_forward_length, _FF), (writer.add_block_count, 1),
                       (writer.add_head_count, heads), (writer.add_head_count_kv, heads),
                       (writer.add_key_length, head_dim), (writer.add_value_length, head_dim)):
        add(value)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["yes", "no"])
    tokens = [*_byte_tokens(), "\u0120t", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 3) + [gguf.TokenType.CONTROL] * 3)
    writer.add_token_merges(["\u0120 t"])
    writer.add_eos_token_id(len(tokens) - 3)
    writer.add_add_bos_token(False)

    def random(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    def ones(name: str, n: int) -> None:
        writer.add_tensor(name, np.ones(n, np.float32))

    random("token_embd.weight", len(tokens), _E)
    ones("output_norm.weight", _E)
    ones("blk.0.attn_norm.weight", _E)
    for name in ("attn_q", "attn_k", "attn_v"):
        random(f"blk.0.{name}.weight", heads * head_dim, _E)
    random("blk.0.attn_output.weight", _E, heads * head_dim)
    ones("blk.0.attn_q_norm.weight", head_dim)
    ones("blk.0.attn_k_norm.weight", head_dim)
    ones("blk.0.ffn_norm.weight", _E)
    random("blk.0.ffn_gate.weight", _FF, _E)
    random("blk.0.ffn_up.weight", _FF, _E)
    random("blk.0.ffn_down.weight", _E, _FF)
    random("cls.output.weight", 2, _E)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _byte_tokens() -> list[str]:
    """GPT-2's byte-level alphabet: each byte as the printable character that stands for it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    shifted = dict(zip(printable, printable))
    shifted.update({b: 256 + i for i, b in enumerate(b for b in range(256) if b not in shifted)})
    return [chr(shifted[b]) for b in range(256)]


def reference_scores(path: Path, inputs: list[list[int]], n_batch: int = 512) -> list[float]:
    """llama-cpp-python's scores of ``inputs``, sigmoid applied to the first output: what
    llamactor's must equal for one label."""
    return [float(1.0 / (1.0 + np.exp(-row[0]))) for row in reference_outputs(path, inputs, n_batch)]


def reference_outputs(path: Path, inputs: list[list[int]], n_batch: int = 512) -> np.ndarray:
    """llama-cpp-python's raw rank-pooling outputs [len(inputs), n_cls_out]: each input a whole
    pair, decoded alone as sequence 0, in a context like an embedding step's
    (``Config.embedding_n_batch`` cells, no flash attention, as llamactor's rank context)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
                          n_ctx=n_batch, n_batch=n_batch, n_ubatch=n_batch, flash_attn=False, verbose=False)
    try:
        n_out = llama_cpp.llama_model_n_cls_out(llm._model.model)
        rows = []
        for tokens in inputs:
            llm._batch.reset()
            llm._ctx.kv_cache_clear()
            llm._batch.add_sequence(tokens, 0, True)
            llm._ctx.decode(llm._batch)
            rows.append(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)[:n_out])
        return np.array(rows, dtype=np.float64)
    finally:
        llm.close()


def vocab_tokenizer(path: Path | str) -> Any:
    """A ``llamactor.native.tokenizer.Tokenizer`` over the GGUF's vocabulary alone (no weights,
    no context): pairs built for a file without serving it. Lives as long as the process."""
    import llama_cpp

    from llamactor.native.loading import init_backend
    from llamactor.native.tokenizer import Tokenizer

    init_backend()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, path
    return Tokenizer(llama_cpp.llama_model_get_vocab(model))
