"""Configuration of one actor tree (``Config``; its default sampling is a ``SamplingParams``,
``llamactor.base.sampling``).

A frozen, slotted dataclass validated in ``__post_init__``: a bad value fails at construction
with a message naming the field, never later inside the batcher thread.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from llamactor.base.adapters import parse_loras
from llamactor.base.errors import InvalidRequestError, SequenceLimitError, require as _require
from llamactor.base.chat_template import ChatTemplateError, check_template_syntax
from llamactor.base.priority import check_policy
from llamactor.base.sampling import SamplingParams
from llamactor.base.tenants import Tenant
from llamactor.base.unset import fill_unset, set_options


# Sequence ids one llama context may hold: llama.cpp's LLAMA_MAX_SEQ. Running sequences, pinned
# system prompts and cached prefixes share them. A model with sliding-window layers holds half:
# the engine gives each of its sequences a shadow id (native/batch.py), so the most is per model
# (``max_sequences``), checked where the model is loaded (``Config.seq_ids_within``).
MAX_SEQUENCES = 256
# Sequence ids a configured system prompt pins (its raw and its chat-template form).
PINNED_SEQ_IDS = 2
# Cached prefixes the default id pool has room for, at least (more with a larger n_parallel).
DEFAULT_CACHED_SEQ_IDS = 32

# Element types of the KV cache (llama.cpp's type_k / type_v): f16, or quantized to 8 or 4 bits.
KV_TYPES = ("f16", "q8_0", "q4_0")
FLASH_ATTN = ("auto", "on", "off")  # llama.cpp's flash attention: auto (where the backend has it)
MAX_FRONTEND_PROCESSES = 64  # a sane bound: each is a whole Python process with the app
LOAD_ON_REQUEST = ("admins", "tenants")  # who may load a model by asking for it (Config.load_on_request)


def max_sequences(sliding_window: bool) -> int:
    """The most sequence ids a context holds on a model with (or without) sliding-window layers."""
    return MAX_SEQUENCES // 2 if sliding_window else MAX_SEQUENCES


def default_n_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


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


@dataclass(frozen=True, slots=True)
class Config:
    """One model, one llama context, one batcher. ``model=None`` means the default Gemma 3 270M."""

    model: str | None = None
    n_ctx: int = 8192  # total KV cells, shared by all sequences (unified KV cache)
    n_parallel: int = 16  # sequences decoded at once
    # Sequence ids of the context: running sequences, pinned system prompts and cached prefixes
    # (one each). llama.cpp reserves a logits row (n_vocab floats) per id and its shadow: 2 MiB per
    # id for Gemma's 262k vocabulary. None: n_parallel + 2 + max(n_parallel, 32) with the prefix
    # cache (50 for 16 sequences), n_parallel + 2 without; at most the model's most: 256, or 128
    # on a model with sliding-window layers (Gemma 3), whose sequences each take a shadow id too.
    n_seq_ids: int | None = None
    n_batch: int = 512  # token budget of one step (decode tokens + prompt chunks)
    n_ubatch: int = 0  # the physical batch llama.cpp computes at once; 0: min(n_batch, 512)
    n_threads: int = field(default_factory=default_n_threads)
    # Layers offloaded to the GPU; -1: all. None: all on a build with a GPU backend (make install
    # GGML=cuda / vulkan / metal), none on a CPU build (what the engine resolves it to: EngineInfo).
    n_gpu_layers: int | None = None
    kv_type: str = "f16"  # the KV cache's element type: f16, q8_0 (about half the bytes), q4_0
    # llama.cpp's flash attention: "auto" (on where the backend has it, CPU included), "on", "off". A
    # quantized KV cache needs it. On and off are different algorithms (a token's log-probability
    # moves by up to ~0.4 nats between them); "off" gives llama-cpp-python's default numbers for a
    # prompt scored alone. Neither is batch-independent: for that, batch_invariant.
    flash_attn: str = "auto"
    # Draw tokens inside llama.cpp's decode graph for requests whose sampler chain it can run there
    # (greedy; bias, penalties, top-k/p, min-p, temperature, seeded draws): only the chosen token
    # crosses to the host instead of a row of n_vocab logits. Grammars and logprobs stay on the host.
    # None: on when layers run on a GPU; off on a CPU-only engine, where ggml's per-sequence
    # samplers cost the decode more than they save the host (docs/performance.md, "Host work").
    # Greedy requests join only when it is True: otherwise the host's argmax is cheaper.
    sample_in_graph: bool | None = None
    # Bit-exact logits alone or in any batch, before or after a cache hit, preemption or restart
    # (docs/performance.md, "Batch-invariant mode"): flash attention on, no repacked weights,
    # n_ubatch <= 32, one thread for single-token steps, GGML_CPU_TILED_MM=0 in the environment.
    batch_invariant: bool = False
    # Launch step k+1's decode as soon as step k's tokens are drawn, and postprocess step k (detokenizing,
    # stop strings, replies) while the device computes (docs/architecture.md, "Overlapped steps").
    # None: on where llama_decode returns before the device finishes (GPU layers); off on a CPU-only
    # engine, whose decode is synchronous. Batch-invariant mode always steps serially.
    overlap_steps: bool | None = None
    batch_size: int | None = None  # pending requests that flush at once; None = n_parallel
    batch_timeout_ms: float = 20.0  # the longest a lone request waits for company
    max_queue: int = 256  # requests waiting for a free seq_id beyond which QueueFullError
    system_prompt: str | None = None  # prefilled once, pinned in the prefix cache, attached via seq_cp
    chat_template: str | None = None  # a Jinja chat template used instead of the GGUF's (or the transcript)
    prefix_cache: bool = True  # keep finished requests' KV as cached prefixes for later requests
    prefix_cache_cells: int | None = None  # most KV cells cached prefixes may hold; None: all that is free
    prefix_cache_rent: bool = True  # idle cached prefixes leave the cells once those cost the steps more than they save
    # Logits rows one step may compute for prompt log-probabilities (scoring); each row is n_vocab
    # floats (1 MiB for Gemma 3), reduced in the step to what was asked for and not kept.
    score_rows_per_step: int = 64
    # Beside other callers' work, scoring may add at most this fraction of it to a step (in compute:
    # prompt tokens + 2 per logits row), so generation keeps its speed under an evaluation load.
    score_time_share: float = 0.25
    # A prompt being scored computes its KV whole, equal to llama-cpp-python scoring it alone
    # (docs/performance.md, *Scoring drift under lm-eval*); off: it attaches a cached prefix --
    # fewer tokens computed, its log-probabilities off by up to ~0.2 nats.
    score_exact: bool = True
    # (The server's default for speculation is a sampling default like any other: ``speculation =
    # "ngram"`` among a model's options.) Drafts only fill a step's idle budget (docs/architecture.md,
    # *Speculation*).
    draft_max: int = 16  # the most drafted tokens one sequence verifies in a step
    cache_ram_mib: int = 1024  # host RAM for cached prefixes evicted from the KV cells (restored on a hit); 0: off
    cache_dir: str | None = None  # a directory keeping cached prefixes across restarts; None: off
    cache_dir_mib: int = 4096  # the most the cache directory holds (least recently used files go first)
    schedule_policy: str = "priority"  # "fcfs" | "priority" | "lpm" (llamactor.scheduling.policy)
    priority_aging_per_s: float = 0.1  # effective priority gained per second waited (docs/architecture.md, *Scheduling*)
    watchdog_timeout_s: float = 60.0  # a step running longer is aborted and the batcher restarted; 0: off
    watchdog_test_hang: bool = False  # tests only: the first batcher's first step hangs until the watchdog fires
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_restarts: int = 5  # batcher restarts allowed within restart_window_s before giving up
    restart_window_s: float = 60.0
    stats_interval_s: float = 10.0  # how often the batcher logs a batcher_stats line while busy
    embedding_n_batch: int = 512  # tokens one embedding step packs, and the longest embedding input
    embedding_n_seq_max: int = 64  # inputs one embedding step packs
    embedding_time_share: float = 0.10  # of decode time embedding steps get while generation also waits
    # Tenants with their own weight, limits or cache scope (``Tenant`` or dicts of its fields);
    # a request naming another tenant gets the defaults (weight 1, no limits, its own cache scope).
    tenants: tuple[Tenant, ...] = ()
    # LoRA adapters loaded with the model: (name, path) in the order given, which numbers them
    # (llama-server's ids); "NAME=PATH" strings or a {name: path} mapping are accepted. A request
    # runs under the ones it names, each with its scale (``lora=``); the others stay off.
    loras: tuple[tuple[str, str], ...] = ()
    # -- transport: the HTTP daemon's edge (``serve``'s options, not a tree's; llamactor.http.origins;
    # docs/operations.md, *Threat model*, "The transport").
    # The lists: a comma list or repeated, "*" for any; beside the loopback names and the bind address.
    body_timeout_s: float = 60.0  # a request body not all received by then: 408, connection closed
    header_timeout_s: float = 10.0  # a request head (line and headers) not all received by then: closed
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    limit_concurrency: int = 1024  # connections and requests at once; beyond: 503
    max_header_bytes: int = 16384  # a request line and headers larger: refused (431 or 400) and closed
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted without keys (DNS rebinding)
    allowed_origins: tuple[str, ...] = ()  # browser origins accepted, CORS included (CSRF)
    # The HTTP front end in processes of its own beside the engine's (docs/operations.md, *Front-end
    # processes*): 0 runs it in the engine's process; N in N processes of their own, sharing one
    # listening socket (the tenants' limits and the stored responses stay the engine's, counted once).
    frontend_processes: int = 0
    # -- tenant limits (docs/operations.md, *Tenants*)
    # Sequences one request may ask for: its choices (n, best_of) times its prompts, in any dialect.
    # Beyond it, or beyond what the queue could ever hold at once (max_queue + n_parallel): a 400.
    max_sequences_per_request: int = 64
    # Who may load an unloaded model by sending it a request: "admins" (default: a tenant's request
    # for it is a 503 saying it is not loaded; /models/load is an admin's) or "tenants" (anyone).
    load_on_request: str = "admins"
    # -- rerank (README.md, *Rerank*)
    max_rerank_documents: int = 1000  # documents one rerank may have; beyond: a 400
    rerank_max_tokens_per_doc: int = 4096  # a document's tokens when a rerank does not say (max_tokens_per_doc)
    # The judging prompt, with literal {query} and {document} (and {instruction}) placeholders, as
    # llama.cpp's GGUF ``tokenizer.chat_template.rerank``; None: the GGUF's, else the built-in one in
    # the model's chat format. Its text reads special tokens; no BOS is added (write it where needed).
    rerank_template: str | None = None
    # An OTLP/HTTP collector (``http://host:4318``) that gets a span per request (docs/operations.md,
    # *Traces*); None: the standard OTEL_EXPORTER_OTLP_* variables decide, else tracing is off.
    otlp_endpoint: str | None = None

    def __post_init__(self) -> None:
        fill_unset(self)
        # the most any model allows; the model's own (half on sliding-window layers) when it loads
        _require(1 <= self.n_parallel <= MAX_SEQUENCES - PINNED_SEQ_IDS,
                 f"n_parallel must be in [1, {MAX_SEQUENCES - PINNED_SEQ_IDS}], got {self.n_parallel}")
        _require(self.n_ctx >= 64, f"n_ctx must be >= 64, got {self.n_ctx}")
        _require(self.n_seq_ids is None or self.n_parallel + PINNED_SEQ_IDS <= self.n_seq_ids <= MAX_SEQUENCES,
                 f"n_seq_ids must be in [n_parallel + {PINNED_SEQ_IDS}, {MAX_SEQUENCES}] "
                 f"(n_parallel={self.n_parallel}), got {self.n_seq_ids}")
        # llama.cpp cuts a causal model's batch to the context and asserts on a larger one: cut it here
        object.__setattr__(self, "n_batch", min(self.n_batch, self.n_ctx))
        _require(self.n_batch >= self.n_parallel,
                 f"n_batch ({self.n_batch}, at most n_ctx) must be >= n_parallel ({self.n_parallel}): every "
                 "running sequence needs one token per step")
        if self.n_ubatch == 0:  # flash attention's tiled kernel starts at 64 query rows: 32 is invariant
            object.__setattr__(self, "n_ubatch", min(self.n_batch, 32 if self.batch_invariant else 512))
        if self.batch_invariant:
            _check_batch_invariant(self)
        _require(1 <= self.n_ubatch <= self.n_batch, f"n_ubatch must be in [1, n_batch], got {self.n_ubatch}")
        _require(self.flash_attn in ("auto", "on", "off"), f"flash_attn must be auto, on or off, got {self.flash_attn!r}")
        _require(self.n_threads >= 1, f"n_threads must be >= 1, got {self.n_threads}")
        _require(self.n_gpu_layers is None or (isinstance(self.n_gpu_layers, int) and self.n_gpu_layers >= -1),
                 f"n_gpu_layers must be >= -1 (-1: all) or None (all on a GPU build), got {self.n_gpu_layers!r}")
        _require(self.batch_timeout_ms >= 0, f"batch_timeout_ms must be >= 0, got {self.batch_timeout_ms}")
        _require(self.batch_size is None or self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        _require(self.max_queue >= 1, f"max_queue must be >= 1, got {self.max_queue}")
        _require(self.max_restarts >= 0, f"max_restarts must be >= 0, got {self.max_restarts}")
        _require(self.system_prompt is None or self.system_prompt != "", "system_prompt must not be empty")
        if self.chat_template is not None:
            try:
                check_template_syntax(self.chat_template)
            except ChatTemplateError as e:
                raise InvalidRequestError(f"chat_template: {e}") from e
        check_policy(self.schedule_policy, self.priority_aging_per_s)
        _require(self.watchdog_timeout_s >= 0, f"watchdog_timeout_s must be >= 0 (0: off), got {self.watchdog_timeout_s}")
        _require(16 <= self.embedding_n_batch <= 8192, f"embedding_n_batch must be in [16, 8192], got {self.embedding_n_batch}")
        _require(1 <= self.embedding_n_seq_max <= 256,
                 f"embedding_n_seq_max must be in [1, 256], got {self.embedding_n_seq_max}")
        _require(0.0 < self.embedding_time_share < 1.0,
                 f"embedding_time_share must be in (0, 1), got {self.embedding_time_share}")
        _require(isinstance(self.draft_max, int) and 1 <= self.draft_max <= 64,
                 f"draft_max must be in [1, 64], got {self.draft_max!r}")
        _require(0.0 < self.score_time_share <= 10.0,
                 f"score_time_share must be in (0, 10], got {self.score_time_share}")
        _require(1 <= self.score_rows_per_step <= self.n_batch,
                 f"score_rows_per_step must be in [1, n_batch], got {self.score_rows_per_step}")
        _require(self.kv_type in KV_TYPES, f"kv_type must be one of {', '.join(KV_TYPES)}, got {self.kv_type!r}")
        _require(self.flash_attn in FLASH_ATTN,
                 f"flash_attn must be one of {', '.join(FLASH_ATTN)}, got {self.flash_attn!r}")
        # llama.cpp quantizes the V cache only inside its flash-attention kernel; without it the
        # context cannot be created, so say so now rather than as a model load failure.
        _require(self.kv_type == "f16" or self.flash_attn != "off",
                 f"kv_type {self.kv_type} needs flash attention: use flash_attn 'auto' or 'on', or kv_type f16")
        _require(isinstance(self.cache_ram_mib, int) and self.cache_ram_mib >= 0,
                 f"cache_ram_mib must be an integer >= 0 (0: off), got {self.cache_ram_mib!r}")
        _require(isinstance(self.cache_dir_mib, int) and self.cache_dir_mib >= 1,
                 f"cache_dir_mib must be an integer >= 1, got {self.cache_dir_mib!r}")
        _require(self.cache_dir is None or self.cache_dir != "", "cache_dir must not be empty (None: off)")
        _require(self.prefix_cache_cells is None or self.prefix_cache_cells >= 0,
                 f"prefix_cache_cells must be >= 0 or None, got {self.prefix_cache_cells}")
        tenants = tuple(t if isinstance(t, Tenant) else Tenant.from_mapping(t, "tenants") for t in self.tenants)
        object.__setattr__(self, "tenants", tenants)
        _require(len({t.name for t in tenants}) == len(tenants), "tenants must have distinct names")
        object.__setattr__(self, "loras", parse_loras(self.loras))
        _check_transport(self)
        # -- tenant limits (docs/operations.md, *Tenants*)
        _require(isinstance(self.max_sequences_per_request, int) and self.max_sequences_per_request >= 1,
                 f"max_sequences_per_request must be an integer >= 1, got {self.max_sequences_per_request!r}")
        _check_rerank(self)
        _require(self.load_on_request in LOAD_ON_REQUEST,
                 f"load_on_request must be one of {', '.join(LOAD_ON_REQUEST)}, got {self.load_on_request!r}")

    @property
    def seq_ids(self) -> int:
        """The sequence ids the context is made with on a model without sliding-window layers."""
        return self.seq_ids_within(MAX_SEQUENCES)

    def seq_ids_within(self, most: int, model: str = "the model") -> int:
        """The sequence ids the context is made with on a model holding at most ``most`` (``n_seq_ids``,
        or what this configuration needs, cut to ``most``); ``SequenceLimitError`` naming ``model``
        and its most when ``n_parallel`` or ``n_seq_ids`` asks for more. Runs where the model loads."""
        needed = self.n_seq_ids if self.n_seq_ids is not None else self.n_parallel + PINNED_SEQ_IDS
        if needed > most:
            asked = (f"n_seq_ids={self.n_seq_ids}" if self.n_seq_ids is not None else
                     f"n_parallel={self.n_parallel} (+ {PINNED_SEQ_IDS} for a system prompt)")
            shadows = " (sliding-window layers: each sequence also takes a shadow id)" if most < MAX_SEQUENCES else ""
            raise SequenceLimitError(f"{model} holds at most {most} sequence ids in one context{shadows}, "
                                     f"so n_parallel <= {most - PINNED_SEQ_IDS} and n_seq_ids <= {most}; "
                                     f"asked for {asked}", max_sequences=most)
        if self.n_seq_ids is not None:
            return self.n_seq_ids
        # batch-invariant mode keeps finished requests' cells even without the prefix cache (packed_kv)
        cached = max(self.n_parallel, DEFAULT_CACHED_SEQ_IDS) if self.prefix_cache or self.batch_invariant else 0
        return min(most, self.n_parallel + PINNED_SEQ_IDS + cached)

    @property
    def lora_names(self) -> tuple[str, ...]:
        """The LoRA adapters' names in ``loras`` order: llama-server's adapter ids are these indexes."""
        return tuple(name for name, _ in self.loras)

    @property
    def flush_batch_size(self) -> int:
        return self.batch_size if self.batch_size is not None else self.n_parallel

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> Config:
        """Build a Config from keyword arguments; sampling names go into ``sampling``. An option
        given as None is not set: its default holds (``max_tokens=None`` too; -1 is no limit)."""
        kwargs = set_options(kwargs)
        config_names = {f.name for f in dataclasses.fields(cls)}
        sampling_names = {f.name for f in dataclasses.fields(SamplingParams)}
        unknown = set(kwargs) - config_names - sampling_names
        _require(not unknown, f"unknown option(s): {', '.join(sorted(unknown))}")
        sampling = kwargs.pop("sampling", SamplingParams())
        _require(isinstance(sampling, SamplingParams), f"sampling must be SamplingParams, got {sampling!r:.100}")
        sampling = sampling.replace(**{k: kwargs.pop(k) for k in list(kwargs) if k in sampling_names})
        return cls(sampling=sampling, **kwargs)
