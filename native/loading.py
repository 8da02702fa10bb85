"""Loading a GGUF model into llama.cpp: the model, its one context, and ``EngineInfo``.

The backend is set up once per process (its log kept to errors); the model loads with the layers
asked for on a GPU; the context gets llamactor's settings: on a model with sliding-window layers a
shadow id per sequence (twice the sequences, see ``native/batch.py``; so half of llama.cpp's 256
ids for them, all 256 on other models), one unified KV pool, the KV cache type and flash
attention, the abort flag the watchdog sets; then the model's metadata (its recommended sampling among
it), its LoRA adapters and its chat template are read, and ``EngineInfo`` says what llama.cpp made. ``Engine``
(``native/engine.py``) holds what ``load_model`` returns, decodes on it and frees it.

Runs on the thread that constructs the ``Engine`` (the batcher actor's, when it starts).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llama_cpp

from llamactor.base.chat_template import ChatTemplate
from llamactor.base.config import max_sequences
from llamactor.base.engine_info import EngineInfo
from llamactor.base.errors import ModelLoadError, SequenceLimitError
from llamactor.base.sampling_defaults import gguf_sampling
from llamactor.native import amx_guard, devices, invariance
from llamactor.native.abort import AbortFlag, TestHang
from llamactor.native.adapters import Adapters
from llamactor.native.embedding import default_pooling, is_ranking
from llamactor.native.tokenizer import Tokenizer

_backend_lock = threading.Lock()
_backend_ready = False
_LOG_LEVEL_ERROR = 4


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet_log(level: int, text: bytes, user_data: int) -> None:
    # llama.cpp prints every tensor it loads; keep only its errors, unless asked for all.
    if level == _LOG_LEVEL_ERROR or os.environ.get("LLAMACTOR_LLAMA_LOG"):
        os.write(2, text)


def init_backend() -> None:
    """llama.cpp's backend, set up once per process, and its log kept to errors (any thread)."""
    global _backend_ready
    with _backend_lock:
        # Every time: llama_cpp.Llama (the benchmark's baseline) installs its own log callback.
        llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p(0))
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True


_KV_GGML_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
_FLASH_ATTN_TYPES = {"auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                     "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}


@dataclass(slots=True)
class LoadedModel:
    """What ``load_model`` made; the ``Engine`` holding it frees ``ctx`` and ``model``."""

    model: Any  # llama_model*
    ctx: Any  # llama_context*
    tokenizer: Tokenizer
    adapters: Adapters
    chat_template: ChatTemplate
    info: EngineInfo
    test_hang: TestHang | None


# The sequence ids a context is made with: a number, or a function of the model's most and its
# name that gives it (``Config.seq_ids_within``: a default cut to the model, an error beyond it).
SeqIds = int | Callable[[int, str], int]


def load_model(model_path: str, *, n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: SeqIds, n_threads: int,
               n_gpu_layers: int | None, chat_template: str | None, kv_type: str, flash_attn: str,
               test_hang: bool, loras: tuple[tuple[str, str], ...], batch_invariant: bool,
               abort_flag: AbortFlag) -> LoadedModel:
    """The model at ``model_path`` and its context (``ModelLoadError`` if llama.cpp refuses
    either, ``SequenceLimitError`` if ``n_seq_max`` is more than the model holds); decodes stop
    when ``abort_flag`` is set."""
    model, cparams, n_gpu_layers = _open_model(model_path, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                                               batch_invariant=batch_invariant)
    n_seq_max, shadows = _sequence_ids(model, model_path, n_seq_max)
    if is_ranking(model):  # it never generates: KV past the longest input it reads would be memory for nothing
        n_ctx = min(n_ctx, llama_cpp.llama_model_n_ctx_train(model))
    _set_context_params(cparams, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                        n_seq_ids=n_seq_max * (2 if shadows else 1), n_threads=n_threads, kv_type=kv_type,
                        flash_attn=flash_attn, batch_invariant=batch_invariant)
    cparams.abort_callback = abort_flag.callback
    cparams.abort_callback_data = abort_flag.data
    hang = TestHang(abort_flag, cparams) if test_hang else None
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        llama_cpp.llama_model_free(model)
        raise ModelLoadError(f"llama.cpp could not create a context (n_ctx={n_ctx}, n_seq_max={n_seq_max}, "
                             f"kv_type={kv_type}, flash_attn={flash_attn})")
    tokenizer = Tokenizer(llama_cpp.llama_model_get_vocab(model))
    metadata = read_metadata(model)
    adapters = _load_adapters(model, ctx, loras, metadata.get("general.architecture", ""))
    template = ChatTemplate(metadata.get("tokenizer.chat_template"), bos_token=tokenizer.bos_text,
                            eos_token=tokenizer.eos_text, override=chat_template)
    info = _engine_info(model, ctx, model_path, metadata, tokenizer, template, n_threads=n_threads, kv_type=kv_type,
                        n_gpu_layers=n_gpu_layers, batch_invariant=batch_invariant, shadow_ids=shadows)
    return LoadedModel(model, ctx, tokenizer, adapters, template, info, hang)


def has_sliding_window(model: Any) -> bool:
    """Whether ``model`` has sliding-window layers (Gemma 3: 512 positions), whose cells llama.cpp
    recycles once out of a single owner's window: its sequences need shadow ids (``native/batch.py``)."""
    return llama_cpp.llama_model_n_swa(model) > 0


def _sequence_ids(model: Any, model_path: str, n_seq_max: SeqIds) -> tuple[int, bool]:
    """The sequence ids the caller asked for on this model, and whether each needs a shadow id;
    the model is freed before an error (``SequenceLimitError`` beyond its most) goes on."""
    shadows = has_sliding_window(model)
    most, name = max_sequences(shadows), os.path.basename(model_path)
    try:
        wanted = n_seq_max(most, name) if callable(n_seq_max) else n_seq_max
        if not 1 <= wanted <= most:
            raise SequenceLimitError(f"{name} holds at most {most} sequence ids in one context"
                                     f"{' (sliding-window layers: each sequence also takes a shadow id)' if shadows else ''}"
                                     f", got n_seq_max={wanted}", max_sequences=most)
    except BaseException:
        llama_cpp.llama_model_free(model)
        raise
    return wanted, shadows


def _open_model(model_path: str, *, n_threads: int, n_gpu_layers: int | None,
                batch_invariant: bool) -> tuple[Any, Any, int]:
    """The loaded model, the context parameters to complete, and the layers on a GPU."""
    init_backend()
    # before the model loads: a build whose AMX kernels crash here would die on the first decode
    amx_guard.check(llama_cpp.llama_print_system_info().decode(errors="replace"))
    if batch_invariant:
        invariance.claim_tiled_mm_off()  # before this process's first matmul, or refused
    if not os.path.isfile(model_path):
        raise ModelLoadError(f"model file not found: {model_path}")
    mparams = llama_cpp.llama_model_default_params()
    # None: every layer on a GPU build, none on a CPU one
    mparams.n_gpu_layers = devices.default_n_gpu_layers() if n_gpu_layers is None else n_gpu_layers
    cparams = llama_cpp.llama_context_default_params()
    if batch_invariant:  # (it sets both: the model's layers, the context's threads)
        invariance.invariant_params(mparams, cparams, n_threads)
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mparams)
    if not model:
        raise ModelLoadError(f"llama.cpp could not load {model_path} (not a GGUF model?)")
    invariance.mark_model_loaded()
    return model, cparams, int(mparams.n_gpu_layers)


def _set_context_params(cparams: Any, *, n_ctx: int, n_batch: int, n_ubatch: int, n_seq_ids: int, n_threads: int,
                        kv_type: str, flash_attn: str, batch_invariant: bool) -> None:
    """llamactor's context settings (batch-invariant mode set its threads and flash attention already);
    ``n_seq_ids``: llama.cpp's sequence ids, the shadows' included."""
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_ubatch
    cparams.n_seq_max = n_seq_ids
    # llama.cpp reserves an output row per sequence id, asserting they fit its outputs (n_batch by
    # default): a small context (n_batch cut to n_ctx) with the default id pool would abort.
    cparams.n_outputs_max = max(n_batch, n_seq_ids)
    if not batch_invariant:
        cparams.n_threads = cparams.n_threads_batch = n_threads
    cparams.kv_unified = True  # one KV pool: a shared prefix is stored once, not per sequence
    # Shadows keep sliding-window cells alive as long as their sequence holds them, so the
    # SWA cache must have as many cells as the full one (it does anyway once n_swa * n_seq_max
    # exceeds n_ctx, e.g. 512 * 256 for Gemma 3: no extra memory at the usual sizes; no effect
    # on a model without sliding-window layers).
    cparams.swa_full = True
    cparams.no_perf = True
    cparams.type_k = cparams.type_v = _KV_GGML_TYPES[kv_type]
    # A quantized V cache exists only inside flash attention: "auto" could resolve to off
    # (and fail the context), so a quantized cache asks for it outright.
    if not batch_invariant:
        cparams.flash_attn_type = _FLASH_ATTN_TYPES["on" if kv_type != "f16" and flash_attn == "auto" else flash_attn]


def _load_adapters(model: Any, ctx: Any, loras: tuple[tuple[str, str], ...], architecture: str) -> Adapters:
    """The LoRA adapters on ``model``; a refused one frees the context and the model (and the
    adapters loaded so far with it) before ``ModelLoadError`` goes on."""
    try:
        return Adapters(model, ctx, loras, architecture)
    except ModelLoadError:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)  # frees the adapters loaded so far with it
        raise


def read_metadata(model: Any) -> dict[str, str]:
    """The GGUF metadata of a loaded model, every value as text."""
    out: dict[str, str] = {}
    buf = ctypes.create_string_buffer(1 << 16)
    for i in range(llama_cpp.llama_model_meta_count(model)):
        llama_cpp.llama_model_meta_key_by_index(model, i, buf, len(buf))
        key = buf.value.decode(errors="replace")
        n = llama_cpp.llama_model_meta_val_str_by_index(model, i, buf, len(buf))
        if 0 <= n < len(buf):
            out[key] = buf.value.decode(errors="replace")
    return out


def _engine_info(model: Any, ctx: Any, model_path: str, metadata: dict[str, str], tokenizer: Tokenizer,
                 template: ChatTemplate, *, n_threads: int, kv_type: str, n_gpu_layers: int,
                 batch_invariant: bool, shadow_ids: bool) -> EngineInfo:
    """What llama.cpp made of the model and the context (its sizes, not the ones asked for)."""
    n_ctx = llama_cpp.llama_n_ctx(ctx)
    n_ctx_seq = llama_cpp.llama_n_ctx_seq(ctx) if hasattr(llama_cpp, "llama_n_ctx_seq") else n_ctx
    sampling, sampling_unused = gguf_sampling(metadata)
    desc = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(model, desc, len(desc))
    return EngineInfo(
        model_path=model_path, description=desc.value.decode(errors="replace"),
        n_params=llama_cpp.llama_model_n_params(model), size_bytes=llama_cpp.llama_model_size(model),
        n_vocab=tokenizer.n_vocab, n_embd=llama_cpp.llama_model_n_embd(model),
        embedding_pooling=default_pooling(model), n_ctx_train=llama_cpp.llama_model_n_ctx_train(model),
        n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, n_batch=llama_cpp.llama_n_batch(ctx),
        n_ubatch=llama_cpp.llama_n_ubatch(ctx), n_seq_max=llama_cpp.llama_n_seq_max(ctx) // (2 if shadow_ids else 1), shadow_ids=shadow_ids,
        n_threads=n_threads, kv_type=kv_type, chat_template=template.name,
        looks_like_base_model=template.base_model,
        metadata={k: v for k, v in metadata.items() if k != "tokenizer.chat_template"},
        devices=devices.devices(), gpu_offload=devices.gpu_offload(), n_gpu_layers=n_gpu_layers,
        tool_format=template.tool_format, batch_invariant=batch_invariant,
        gguf_sampling=sampling, gguf_sampling_unused=sampling_unused,
        ranking=is_ranking(model), rerank_template=_named_template(model, b"rerank"),
    )


def _named_template(model: Any, name: bytes) -> str | None:
    """The GGUF's ``tokenizer.chat_template.<name>``, or None."""
    text = llama_cpp.llama_model_chat_template(model, name)
    return text.decode(errors="replace") if text else None
