"""Configuration of one actor tree (``Config``; its default sampling is a ``SamplingParams``,
``llamactor.base.sampling``).

A frozen, slotted dataclass validated in ``__post_init__`` (``config_checks.check_config``): a bad
value fails at construction with a message naming the field, never later inside the batcher thread.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from llamactor.base.config_checks import (FLASH_ATTN, KV_TYPES, LOAD_ON_REQUEST, MAX_FRONTEND_PROCESSES, MAX_SEQUENCES,
                                          PINNED_SEQ_IDS, check_config)
from llamactor.base.errors import SequenceLimitError, require as _require
from llamactor.base.sampling import SamplingParams
from llamactor.base.tenants import Tenant
from llamactor.base.unset import set_options

__all__ = ["Config", "DEFAULT_CACHED_SEQ_IDS", "FLASH_ATTN", "KV_TYPES", "LOAD_ON_REQUEST", "MAX_FRONTEND_PROCESSES",
           "MAX_SEQUENCES", "PINNED_SEQ_IDS", "default_n_threads", "max_sequences"]


# Cached prefixes the default id pool has room for, at least (more with a larger n_parallel).
DEFAULT_CACHED_SEQ_IDS = 32


def max_sequences(sliding_window: bool) -> int:
    """The most sequence ids a context holds on a model with (or without) sliding-window layers."""
    return MAX_SEQUENCES // 2 if sliding_window else MAX_SEQUENCES


def default_n_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


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
    # Idle cached prefixes leave the cells once those cost the steps more than they save (``cell_rent``).
    # None: on unless flash attention is off (``Config.cell_rent``).
    prefix_cache_rent: bool | None = None
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
        check_config(self)

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
    def cell_rent(self) -> bool:
        """Whether kept cells pay rent (``prefix_cache_rent``). By default not with flash attention
        off: there llama.cpp's numbers for a prompt depend on where its cells lie (measured: a 12-token
        prompt laid across holes moved its log-probabilities by up to 0.6), and the rent frees cells
        between live entries, so a prompt scored alone would no longer equal llama-cpp-python's (with
        flash attention on they stayed bit-exact). Even with flash attention, a running stream whose
        next token lands in a freed cell below its others gets other numbers, so with the rent on a
        stream's log-probabilities follow when it let entries go (tests/native/test_cell_placement.py).
        Never in batch-invariant mode: it frees cells only by its flushes (``packed_kv``)."""
        if self.batch_invariant:
            return False
        return self.prefix_cache_rent if self.prefix_cache_rent is not None else self.flash_attn != "off"

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
