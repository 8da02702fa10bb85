"""``EngineInfo``: what a loaded model and its context are, as the engine reports them.

Made by ``llamactor.native.engine`` on the batcher thread; read anywhere (handles, CLI, HTTP).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EngineInfo:
    model_path: str
    description: str
    n_params: int
    size_bytes: int
    n_vocab: int
    n_embd: int  # the width of an embedding
    embedding_pooling: str  # what embed() pools with by default: the GGUF's pooling type, else mean
    n_ctx_train: int
    n_ctx: int  # KV cells actually allocated (llama.cpp may round the request up)
    n_ctx_seq: int  # the most one sequence may hold
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_threads: int
    kv_type: str  # the KV cache's element type (f16, q8_0, q4_0)
    chat_template: str  # which chat format requests with messages get (ChatTemplate.name)
    looks_like_base_model: bool  # the GGUF has no chat template: a pretrained, not a chat, model
    metadata: dict[str, str] = field(default_factory=dict)
