"""``EngineInfo``: what a loaded model and its context are, as the engine reports them, and
``Device``: one ggml backend device of the llama.cpp build (``llamactor.native.devices`` reads them).

Made by ``llamactor.native`` on the batcher thread; read anywhere (handles, CLI, HTTP).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llamactor.base.tool_format import FALLBACK, ToolCallFormat


# ggml_backend_dev_type, in its enum's order (ggml-backend.h)
DEVICE_TYPES = ("cpu", "gpu", "igpu", "accel", "meta")


@dataclass(frozen=True, slots=True)
class Device:
    """One device a ggml backend of the loaded llama.cpp offers (memory as of when it was read)."""

    name: str  # ggml's name: "CPU", "CUDA0", "Vulkan0", "MTL0" ...
    description: str  # what the backend says of it: the GPU's or the CPU's model name
    type: str  # one of DEVICE_TYPES: cpu, gpu (own memory), igpu (host memory), accel, meta
    memory_free: int  # bytes
    memory_total: int  # bytes

    @property
    def is_gpu(self) -> bool:
        return self.type in ("gpu", "igpu")

    def summary(self) -> str:
        """``CUDA0 (NVIDIA H100 80GB HBM3): 77.1 of 79.2 GiB free``."""
        gib = 1 << 30
        return (f"{self.name} ({self.description}): {self.memory_free / gib:.1f} of "
                f"{self.memory_total / gib:.1f} GiB free")


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
    n_seq_max: int  # sequence ids callers may use (the shadows not counted)
    n_threads: int
    kv_type: str  # the KV cache's element type (f16, q8_0, q4_0)
    chat_template: str  # which chat format requests with messages get (ChatTemplate.name)
    looks_like_base_model: bool  # the GGUF has no chat template: a pretrained, not a chat, model
    metadata: dict[str, str] = field(default_factory=dict)
    # The build's backend devices, memory read once the model and its context were allocated; and
    # whether the build can offload layers to a GPU (llama_supports_gpu_offload).
    devices: tuple[Device, ...] = ()
    gpu_offload: bool = False
    n_gpu_layers: int = 0  # layers offloaded as asked of llama.cpp (-1: all)
    # How the model writes a tool call, learned from its chat template (llamactor.base.tool_probe):
    # the caller's side builds the tool grammar and parses streamed calls in it.
    tool_format: ToolCallFormat = FALLBACK
    batch_invariant: bool = False  # Config.batch_invariant: bit-exact logits in any company
    # Every sequence id has a shadow id (sliding-window layers: native/batch.py): the context holds
    # 2 * n_seq_max of llama.cpp's ids, so at most 128 sequences; else all 256.
    shadow_ids: bool = False
    # The GGUF's recommended sampling (general.sampling.*) as SamplingParams fields: the model's
    # defaults under the operator's (llamactor.base.sampling_defaults); and the general.sampling.*
    # keys not followed, each with why.
    gguf_sampling: dict[str, float | int] = field(default_factory=dict)
    gguf_sampling_unused: dict[str, str] = field(default_factory=dict)
    # A ranking-head GGUF (pooling type rank, e.g. a converted bge-reranker): it scores (query,
    # document) inputs (``Client.submit_rank_scores``) and embeds, but does not generate.
    ranking: bool = False
    # The GGUF's ``tokenizer.chat_template.rerank``: how llama-server lays out a (query, document)
    # pair, ``{query}`` and ``{document}`` replaced literally (``llamactor.base.rank_pairs``).
    rerank_template: str | None = None
