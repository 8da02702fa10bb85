"""The checks ``Config.__post_init__`` runs (``check_config``): a bad value fails at construction
with a message naming the field, never later inside the batcher thread; a few values are put in
their one form on the way (``n_batch`` cut to the context, ``n_ubatch``'s default, tenants,
adapters, host and origin lists). Pure; whichever thread builds the ``Config``.
"""

from __future__ import annotations

from typing import Any

from llamactor.base.adapters import parse_loras
from llamactor.base.chat_template import ChatTemplateError, check_template_syntax
from llamactor.base.errors import InvalidRequestError, require as _require
from llamactor.base.priority import check_policy
from llamactor.base.tenants import Tenant
from llamactor.base.unset import fill_unset

# The checks take the ``Config`` being built as ``Any``: importing its class here would make an
# import cycle (tests/test_layers.py). Every line runs on every construction, so a misspelt field
# fails the first test that builds one.
Config = Any

# Sequence ids one llama context may hold: llama.cpp's LLAMA_MAX_SEQ. Running sequences, pinned
# system prompts and cached prefixes share them. A model with sliding-window layers holds half:
# the engine gives each of its sequences a shadow id (native/batch.py), so the most is per model
# (``config.max_sequences``), checked where the model is loaded (``Config.seq_ids_within``).
MAX_SEQUENCES = 256
# Sequence ids a configured system prompt pins (its raw and its chat-template form).
PINNED_SEQ_IDS = 2
# Element types of the KV cache (llama.cpp's type_k / type_v): f16, or quantized to 8 or 4 bits.
KV_TYPES = ("f16", "q8_0", "q4_0")
FLASH_ATTN = ("auto", "on", "off")  # llama.cpp's flash attention: auto (where the backend has it)
MAX_FRONTEND_PROCESSES = 64  # a sane bound: each is a whole Python process with the app
LOAD_ON_REQUEST = ("admins", "tenants")  # who may load a model by asking for it (Config.load_on_request)


def check_config(c: Config) -> None:
    """Every field of ``c`` checked (``InvalidRequestError`` naming the first bad one), and the
    normalized ones set."""
    fill_unset(c)
    _check_sizes(c)
    _check_engine(c)
    _check_side_work(c)
    _check_caches(c)
    _check_tenants_and_adapters(c)
    _check_transport(c)
    _check_rerank(c)


def _check_sizes(c: Config) -> None:
    """Sequences, context, batches and threads (``n_batch`` cut to the context, ``n_ubatch``'s default)."""
    # the most any model allows; the model's own (half on sliding-window layers) when it loads
    _require(1 <= c.n_parallel <= MAX_SEQUENCES - PINNED_SEQ_IDS,
             f"n_parallel must be in [1, {MAX_SEQUENCES - PINNED_SEQ_IDS}], got {c.n_parallel}")
    _require(c.n_ctx >= 64, f"n_ctx must be >= 64, got {c.n_ctx}")
    _require(c.n_seq_ids is None or c.n_parallel + PINNED_SEQ_IDS <= c.n_seq_ids <= MAX_SEQUENCES,
             f"n_seq_ids must be in [n_parallel + {PINNED_SEQ_IDS}, {MAX_SEQUENCES}] "
             f"(n_parallel={c.n_parallel}), got {c.n_seq_ids}")
    # llama.cpp cuts a causal model's batch to the context and asserts on a larger one: cut it here
    object.__setattr__(c, "n_batch", min(c.n_batch, c.n_ctx))
    _require(c.n_batch >= c.n_parallel,
             f"n_batch ({c.n_batch}, at most n_ctx) must be >= n_parallel ({c.n_parallel}): every "
             "running sequence needs one token per step")
    if c.n_ubatch == 0:  # flash attention's tiled kernel starts at 64 query rows: 32 is invariant
        object.__setattr__(c, "n_ubatch", min(c.n_batch, 32 if c.batch_invariant else 512))
    if c.batch_invariant:
        _check_batch_invariant(c)
    _require(1 <= c.n_ubatch <= c.n_batch, f"n_ubatch must be in [1, n_batch], got {c.n_ubatch}")
    _require(c.n_threads >= 1, f"n_threads must be >= 1, got {c.n_threads}")
    _require(c.n_gpu_layers is None or (isinstance(c.n_gpu_layers, int) and c.n_gpu_layers >= -1),
             f"n_gpu_layers must be >= -1 (-1: all) or None (all on a GPU build), got {c.n_gpu_layers!r}")


def _check_engine(c: Config) -> None:
    """The batcher's flushing, queue, restarts, prompt and policy; the KV cache's element type."""
    _require(c.batch_timeout_ms >= 0, f"batch_timeout_ms must be >= 0, got {c.batch_timeout_ms}")
    _require(c.batch_size is None or c.batch_size >= 1, f"batch_size must be >= 1, got {c.batch_size}")
    _require(c.max_queue >= 1, f"max_queue must be >= 1, got {c.max_queue}")
    _require(c.max_restarts >= 0, f"max_restarts must be >= 0, got {c.max_restarts}")
    _require(c.system_prompt is None or c.system_prompt != "", "system_prompt must not be empty")
    if c.chat_template is not None:
        try:
            check_template_syntax(c.chat_template)
        except ChatTemplateError as e:
            raise InvalidRequestError(f"chat_template: {e}") from e
    check_policy(c.schedule_policy, c.priority_aging_per_s)
    _require(c.watchdog_timeout_s >= 0, f"watchdog_timeout_s must be >= 0 (0: off), got {c.watchdog_timeout_s}")
    _require(c.kv_type in KV_TYPES, f"kv_type must be one of {', '.join(KV_TYPES)}, got {c.kv_type!r}")
    _require(c.flash_attn in FLASH_ATTN,
             f"flash_attn must be one of {', '.join(FLASH_ATTN)}, got {c.flash_attn!r}")
    # llama.cpp quantizes the V cache only inside its flash-attention kernel; without it the
    # context cannot be created, so say so now rather than as a model load failure.
    _require(c.kv_type == "f16" or c.flash_attn != "off",
             f"kv_type {c.kv_type} needs flash attention: use flash_attn 'auto' or 'on', or kv_type f16")


def _check_side_work(c: Config) -> None:
    """Embeddings, drafts and scoring beside generation."""
    _require(16 <= c.embedding_n_batch <= 8192, f"embedding_n_batch must be in [16, 8192], got {c.embedding_n_batch}")
    _require(1 <= c.embedding_n_seq_max <= 256,
             f"embedding_n_seq_max must be in [1, 256], got {c.embedding_n_seq_max}")
    _require(0.0 < c.embedding_time_share < 1.0,
             f"embedding_time_share must be in (0, 1), got {c.embedding_time_share}")
    _require(isinstance(c.draft_max, int) and 1 <= c.draft_max <= 64,
             f"draft_max must be in [1, 64], got {c.draft_max!r}")
    _require(0.0 < c.score_time_share <= 10.0,
             f"score_time_share must be in (0, 10], got {c.score_time_share}")
    _require(1 <= c.score_rows_per_step <= c.n_batch,
             f"score_rows_per_step must be in [1, n_batch], got {c.score_rows_per_step}")


def _check_caches(c: Config) -> None:
    """The prefix cache and its RAM and disk tiers."""
    _require(isinstance(c.cache_ram_mib, int) and c.cache_ram_mib >= 0,
             f"cache_ram_mib must be an integer >= 0 (0: off), got {c.cache_ram_mib!r}")
    _require(isinstance(c.cache_dir_mib, int) and c.cache_dir_mib >= 1,
             f"cache_dir_mib must be an integer >= 1, got {c.cache_dir_mib!r}")
    _require(c.cache_dir is None or c.cache_dir != "", "cache_dir must not be empty (None: off)")
    _require(c.prefix_cache_cells is None or c.prefix_cache_cells >= 0,
             f"prefix_cache_cells must be >= 0 or None, got {c.prefix_cache_cells}")


def _check_tenants_and_adapters(c: Config) -> None:
    """Tenants (docs/operations.md, *Tenants*) and LoRA adapters, each in its one form."""
    tenants = tuple(t if isinstance(t, Tenant) else Tenant.from_mapping(t, "tenants") for t in c.tenants)
    object.__setattr__(c, "tenants", tenants)
    _require(len({t.name for t in tenants}) == len(tenants), "tenants must have distinct names")
    _require(isinstance(c.max_sequences_per_request, int) and c.max_sequences_per_request >= 1,
             f"max_sequences_per_request must be an integer >= 1, got {c.max_sequences_per_request!r}")
    _require(c.load_on_request in LOAD_ON_REQUEST,
             f"load_on_request must be one of {', '.join(LOAD_ON_REQUEST)}, got {c.load_on_request!r}")
    object.__setattr__(c, "loras", parse_loras(c.loras))


def _check_batch_invariant(c: Config) -> None:
    """Refuse what batch-invariant mode cannot make (or has not been checked to make) bit-exact."""
    _require(c.flash_attn != "off", "batch_invariant needs flash attention (its one-row kernel is the invariant "
             "one): use flash_attn 'auto' or 'on'")
    _require(c.n_ubatch <= 32, f"batch_invariant needs n_ubatch <= 32 (flash attention tiles 64 query rows "
             f"differently), got {c.n_ubatch}")
    _require(c.n_gpu_layers in (None, 0), "batch_invariant is verified on CPU only: use n_gpu_layers 0")
    _require(c.sample_in_graph is not True, "batch_invariant samples on the host: sample_in_graph must be off")
    _require(c.kv_type == "f16", f"batch_invariant is verified with an f16 KV cache only, got kv_type {c.kv_type}")
    _require(not c.loras, "batch_invariant is not verified with LoRA adapters (their matmuls pick kernels by rows)")


def _check_rerank(c: Config) -> None:
    for name in ("max_rerank_documents", "rerank_max_tokens_per_doc"):
        value = getattr(c, name)
        _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                 f"{name} must be an integer >= 1, got {value!r}")
    _require(c.rerank_template is None or (isinstance(c.rerank_template, str) and all(
        c.rerank_template.count(p) == 1 for p in ("{query}", "{document}"))),
        "rerank_template must hold {query} and {document} once each (or be None: the GGUF's, else the built-in)")


def _check_transport(c: Config) -> None:
    """The daemon's HTTP edge (docs/operations.md, *Threat model*, "The transport"): positive limits,
    host and origin names without spaces."""
    for name in ("body_timeout_s", "header_timeout_s", "keep_alive_s"):
        _require(getattr(c, name) > 0, f"{name} must be > 0, got {getattr(c, name)}")
    _require(c.limit_concurrency >= 1, f"limit_concurrency must be >= 1, got {c.limit_concurrency}")
    _require(c.max_header_bytes >= 1024, f"max_header_bytes must be >= 1024, got {c.max_header_bytes}")
    _require(isinstance(c.frontend_processes, int) and 0 <= c.frontend_processes <= MAX_FRONTEND_PROCESSES,
             f"frontend_processes must be 0 to {MAX_FRONTEND_PROCESSES}, got {c.frontend_processes}")
    for name in ("allowed_hosts", "allowed_origins"):
        object.__setattr__(c, name, tuple(v.strip() for item in getattr(c, name) for v in item.split(",") if v.strip()))
        _require(all(" " not in v for v in getattr(c, name)), f"{name}: a name holds a space: {getattr(c, name)}")
