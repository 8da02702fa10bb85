"""The llama.cpp engine: one model, one context, one reusable batch, raw ``llama_decode``, the KV
operations. ``native/loading.py`` loads the model and makes the context and ``EngineInfo``.

Only the batcher actor's thread may call an ``Engine`` method after construction (llama.cpp
contexts are not thread-safe). Return codes of ``llama_decode`` become typed outcomes: 1 (no KV
slot) retries the step in halves down to single tokens and reports the sequences that still do
not fit; 2 (aborted through ``abort_flag``, by the batcher's watchdog) raises ``StepAbortedError``;
anything else raises ``EngineError``. Both crash the batcher on purpose.

Sequence ids: callers use ``0 .. n_seq_max - 1``. On a model with sliding-window layers the
context holds twice as many, because each sequence has a shadow id that co-owns all its cells
(see ``native/batch.py``); every KV operation applies to both, so to a caller the shadows do not
exist. Hence such a model holds at most half of llama.cpp's ``LLAMA_MAX_SEQ`` sequences, and any
other model all of them (``llamactor.base.config.max_sequences``; ``EngineInfo.shadow_ids``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import llama_cpp
import numpy as np

from llamactor.base.adapters import AdapterSet
from llamactor.base.errors import EngineError, StepAbortedError
from llamactor.native import devices, kv_state
from llamactor.native.abort import AbortFlag
from llamactor.native.batch import ReusableBatch
from llamactor.native.embedding import Embedder
from llamactor.native.graph_sampling import TOKEN_NULL, GraphChain, GraphSamplers, probe_chain
from llamactor.native.kv_state import SeqState
from llamactor.native.loading import SeqIds, load_model
from llamactor.native.logits_rows import LogitsRows
from llamactor.scheduling.cell_map import CellMap


@dataclass(slots=True)
class DecodeResult:
    """What one ``decode`` gave: the logits rows, the sequences that found no room, the graph's tokens."""

    logits: np.ndarray  # [rows, n_vocab]: one row per entry that asked for logits, in order
    failed_seq_ids: frozenset[int]  # sequences that found no KV slot; their rows are meaningless
    # Per output row, the token llama.cpp drew in the graph (TOKEN_NULL: none; that row's logits
    # are in ``logits``). None: no row was sampled in the graph. A graph row's logits are not read.
    tokens: np.ndarray | None = None


@dataclass(slots=True)
class Launched:
    """A decode ``Engine.launch`` started: what ``collect`` reads its rows by (``done``: a split
    decode's result, complete already)."""

    pos: np.ndarray
    seq_id: np.ndarray
    logits: np.ndarray
    in_graph: np.ndarray | None
    done: DecodeResult | None = None


class Engine:
    """One loaded model and its context; the batcher actor's thread calls every method after the
    constructor (the watchdog's thread only sets ``abort_flag``)."""

    def __init__(self, model_path: str, *, n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: SeqIds,
                 n_threads: int, n_gpu_layers: int | None = None, chat_template: str | None = None,
                 kv_type: str = "f16", flash_attn: str = "auto", test_hang: bool = False,
                 graph_sampling: bool | None = None, loras: tuple[tuple[str, str], ...] = (),
                 batch_invariant: bool = False) -> None:
        """Load the model and its context (``native/loading.py``), then make what decoding reuses:
        the batches, the output pages, the graph's samplers. ``n_seq_max``: the sequence ids, or a
        function of the model's most that gives them (``native/loading.py``, ``SeqIds``)."""
        self.abort_flag = AbortFlag()  # set from the watchdog's thread: stops the running decode
        loaded = load_model(model_path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq_max,
                            n_threads=n_threads, n_gpu_layers=n_gpu_layers, chat_template=chat_template,
                            kv_type=kv_type, flash_attn=flash_attn, test_hang=test_hang, loras=loras,
                            batch_invariant=batch_invariant, abort_flag=self.abort_flag)
        self.model, self.ctx, self.test_hang = loaded.model, loaded.ctx, loaded.test_hang
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.tokenizer, self.adapters, self.chat_template = loaded.tokenizer, loaded.adapters, loaded.chat_template
        self.info = loaded.info
        # Where the cells of each sequence lie: what a step attends over (the kept cells' rent).
        self.cells = CellMap(self.info.n_ctx, self.info.n_seq_max, self.info.n_ubatch)
        self.n_vocab = self.tokenizer.n_vocab
        # A sequence's shadow id is seq_id + this; None: the model needs no shadows.
        self._shadow = self.info.n_seq_max if self.info.shadow_ids else None
        # Sliding-window layers (Gemma 3: 512 positions); 0 when the model has none.
        self.n_swa = llama_cpp.llama_model_n_swa(self.model) if hasattr(llama_cpp, "llama_model_n_swa") else 0
        # A recurrent state cannot be cut at a position: such models get no lower cache tiers.
        self.seq_state_supported = not (llama_cpp.llama_model_is_recurrent(self.model)
                                        or llama_cpp.llama_model_is_hybrid(self.model))
        self.batch = ReusableBatch(self.info.n_batch, self._shadow)
        self._scratch = ReusableBatch(self.info.n_batch, self._shadow)  # sub-batches when a step must be split
        self._embedder: Embedder | None = None
        self.rows = LogitsRows(self.ctx, self.n_vocab)  # read after each decode; pages handed back when idle
        self.graph = GraphSamplers(self.ctx, self.memory, self._shadow, self.n_swa)
        if graph_sampling is None:  # where it pays: a GPU (docs/operations.md, "Sampling inside the graph")
            graph_sampling = self.decodes_async
        # (a ranking model never samples: no probe decode on its context, which has no output head)
        self.graph_sampling = (graph_sampling and not batch_invariant and not self.info.ranking
                               and self._probe_graph_sampling())
        self.rows.release(keep=0)

    # -- decoding ---------------------------------------------------------------------------

    def decode(self, token: np.ndarray, pos: np.ndarray, seq_id: np.ndarray, logits: np.ndarray) -> DecodeResult:
        """One ``llama_decode`` of the given entries (parallel arrays); split only on a full KV.

        An entry that asks for logits on a sequence with an attached chain (``attach_chain``) is
        sampled inside the graph: its token comes back in ``DecodeResult.tokens``."""
        return self.collect(self.launch(token, pos, seq_id, logits))

    def launch(self, token: np.ndarray, pos: np.ndarray, seq_id: np.ndarray, logits: np.ndarray) -> Launched:
        """``decode``'s first half: ``llama_decode`` returns before a GPU backend has finished
        (docs/architecture.md, *Overlapped steps*); nothing may be read until ``collect``. A full KV's
        split decodes are done here, at once."""
        in_graph = self.graph.rows(seq_id, logits)
        self.batch.fill(token, pos, seq_id, logits, in_graph)
        rc = llama_cpp.llama_decode(self.ctx, self.batch.view())
        if rc == 0:
            self.cells.placed(pos, seq_id)
            return Launched(pos, seq_id, logits, in_graph)
        if rc == 1:
            return Launched(pos, seq_id, logits, in_graph, self._decode_split(token, pos, seq_id, logits, in_graph))
        raise self._error(rc, len(token))

    def collect(self, launched: Launched) -> DecodeResult:
        """``decode``'s second half: wait for the device (``llama_synchronize``), then read the rows."""
        if launched.done is not None:
            return launched.done
        llama_cpp.llama_synchronize(self.ctx)
        n_out = int(np.count_nonzero(launched.logits))
        tokens = self.graph.tokens(launched.in_graph, launched.logits, launched.seq_id, launched.pos,
                                   np.arange(len(launched.pos)))
        self.rows.wrote(n_out, bool(self.graph.chains))  # after reading the tokens: it may hand back their pages
        return DecodeResult(self.rows.view(n_out), frozenset(), tokens)

    @property
    def decodes_async(self) -> bool:
        """Whether ``llama_decode`` returns before the device finishes: layers offloaded to a GPU."""
        return self.info.n_gpu_layers != 0 and devices.gpu_offload()

    def set_adapters(self, adapters: AdapterSet) -> None:
        """Decode under these LoRA adapters (name, scale) from the next decode on; () the base model."""
        self.adapters.apply(adapters)

    def attach_chain(self, seq_id: int, chain: GraphChain | None) -> None:
        """Sample ``seq_id``'s output rows inside the graph with ``chain`` from the next decode on
        (None: on the host again). Attaching or detaching makes llama.cpp re-plan its graph."""
        self.graph.attach(seq_id, chain)

    def _probe_graph_sampling(self) -> bool:
        """Whether this build's backend draws a token in the graph with every kind of sampler a
        request may bring: one decode of one token on sequence 0, before anything else is there."""
        chain = probe_chain(self.n_vocab)
        try:
            self.graph.attach(0, chain)
            token = np.array([self.tokenizer.bos_id if self.tokenizer.bos_id >= 0 else 0], dtype=np.int32)
            result = self.decode(token, np.zeros(1, np.int32), np.zeros(1, np.int32), np.ones(1, np.int8))
            return result.tokens is not None and int(result.tokens[0]) != TOKEN_NULL
        except EngineError:
            return False
        finally:
            self.graph.attach(0, None)
            chain.free()
            self.seq_rm(0)

    def _error(self, rc: int, n_tokens: int) -> EngineError:
        if rc == 2:
            return StepAbortedError(f"a decode of {n_tokens} tokens was aborted (abort flag set)")
        return EngineError(f"llama_decode returned {rc} for a batch of {n_tokens} tokens")

    def _decode_split(self, token: np.ndarray, pos: np.ndarray, seq_id: np.ndarray,
                      logits: np.ndarray, in_graph: np.ndarray | None) -> DecodeResult:
        """Retry a step that found no KV slot in halves, down to single tokens (docs/architecture.md,
        "A request, module by module").

        llama.cpp restores the cache when it returns 1, so each half starts clean. A sequence
        whose token does not fit even alone has failed: its cells are removed at once (making
        room for the others) and its later tokens are dropped.
        """
        out_rows = np.cumsum(logits) - 1  # entry index -> its row among the outputs
        result = np.zeros((int(np.count_nonzero(logits)), self.n_vocab), dtype=np.float32)
        tokens = None if in_graph is None else np.full(len(result), TOKEN_NULL, dtype=np.int32)
        failed: set[int] = set()
        todo = [np.arange(len(token))]
        while todo:
            idx = todo.pop()
            idx = idx[~np.isin(seq_id[idx], list(failed))] if failed else idx
            if len(idx) == 0:
                continue
            self._scratch.fill(token[idx], pos[idx], seq_id[idx], logits[idx], None if in_graph is None else in_graph[idx])
            rc = llama_cpp.llama_decode(self.ctx, self._scratch.view())
            if rc == 0:
                self.cells.placed(pos[idx], seq_id[idx])
                flagged = idx[logits[idx] != 0]
                part = self.graph.tokens(in_graph, logits, seq_id, pos, idx)
                self.rows.wrote(len(flagged), bool(self.graph.chains))
                result[out_rows[flagged]] = self.rows.view(len(flagged))
                if tokens is not None and part is not None:
                    tokens[out_rows[flagged]] = part
            elif rc == 1 and len(idx) == 1:
                victim = int(seq_id[idx[0]])
                failed.add(victim)
                self.seq_rm(victim)  # its cells are freed now, so the rest of the step may still fit
            elif rc == 1:
                half = len(idx) // 2
                todo += [idx[half:], idx[:half]]  # popped from the end: first half runs first
            else:
                raise self._error(rc, len(idx))
        return DecodeResult(result, frozenset(failed), tokens)

    def decode_batch(self, entries: list[tuple[int, int, int]]) -> DecodeResult:
        """One decode token per sequence as ``(seq_id, token, pos)`` entries, logits for every row (the
        form the bench's baselines use); ``decode`` with every entry asking for logits."""
        seq_id, token, pos = (np.array(column, dtype=np.int32) for column in zip(*entries))
        return self.decode(token, pos, seq_id, np.ones(len(entries), dtype=np.int8))

    def prefill(self, seq_id: int, tokens: list[int], n_past: int = 0) -> None:
        """Compute the KV of ``tokens`` for ``seq_id`` from position ``n_past`` (no logits kept)."""
        step = self.info.n_batch
        for start in range(0, len(tokens), step):
            chunk = np.asarray(tokens[start:start + step], dtype=np.int32)
            n = len(chunk)
            result = self.decode(chunk, np.arange(n_past + start, n_past + start + n, dtype=np.int32),
                                 np.full(n, seq_id, dtype=np.int32), np.zeros(n, dtype=np.int8))
            if result.failed_seq_ids:
                raise EngineError(f"no KV room to prefill {len(tokens)} tokens on sequence {seq_id}")

    # -- KV cache ---------------------------------------------------------------------------

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        """Remove ``seq_id`` from its cells at positions [p0, p1) (-1: open end); freed when unowned."""
        self.graph.cover(seq_id)
        llama_cpp.llama_memory_seq_rm(self.memory, seq_id, p0, p1)
        self.cells.seq_rm(seq_id, p0, p1)
        if self._shadow is not None:
            llama_cpp.llama_memory_seq_rm(self.memory, seq_id + self._shadow, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Let ``dst`` share ``src``'s cells at positions [p0, p1): no copy in the unified cache."""
        self.graph.cover(src)
        llama_cpp.llama_memory_seq_cp(self.memory, src, dst, p0, p1)
        self.cells.seq_cp(src, dst, p0, p1)
        if self._shadow is not None:
            llama_cpp.llama_memory_seq_cp(self.memory, src, dst + self._shadow, p0, p1)

    def clear(self) -> None:
        self.graph.cover_all()  # nothing left to cover after the clear
        llama_cpp.llama_memory_clear(self.memory, True)
        self.cells.clear()

    def seq_pos_max(self, seq_id: int) -> int:
        return llama_cpp.llama_memory_seq_pos_max(self.memory, seq_id)

    def seq_state_bytes(self, seq_id: int) -> int:
        """Bytes of ``seq_id``'s KV as llama.cpp would copy it out (its per-sequence state)."""
        self.graph.cover(seq_id)
        return int(llama_cpp.llama_state_seq_get_size(self.ctx, seq_id))

    def seq_pos_min(self, seq_id: int) -> int:
        """The lowest position of ``seq_id`` still in the sliding-window cache (-1: none)."""
        return llama_cpp.llama_memory_seq_pos_min(self.memory, seq_id)

    def save_seq(self, seq_id: int, n_tokens: int) -> SeqState:
        """A copy of the KV of ``seq_id``'s positions ``0 .. n_tokens - 1``; ``RuntimeError`` unless
        it holds exactly those (an index out of step with the cells must not save a wrong entry)."""
        if (self.seq_pos_min(seq_id), self.seq_pos_max(seq_id)) != (0, n_tokens - 1):
            raise RuntimeError(f"sequence {seq_id} holds positions {self.seq_pos_min(seq_id)}.."
                               f"{self.seq_pos_max(seq_id)}, not 0..{n_tokens - 1}")
        self.graph.cover(seq_id)
        state = kv_state.save(self.ctx, self.memory, seq_id, self._shadow_of(seq_id), n_tokens, self.n_swa)
        return replace(state, cell_order=self.cells.order(seq_id))

    def restore_seq(self, seq_id: int, state: SeqState, scratch_id: int) -> bool:
        """Put a saved state into the empty ``seq_id``; ``scratch_id``, an empty sequence nobody
        uses meanwhile, carries the older sliding-window cells. False: refused, nothing changed."""
        ok = kv_state.restore(self.ctx, self.memory, seq_id, self._shadow_of(seq_id), scratch_id, state)
        if ok:
            self.cells.restored(seq_id, state.n_tokens, state.cell_order)
        return ok

    def _shadow_of(self, seq_id: int) -> int | None:
        return None if self._shadow is None else seq_id + self._shadow

    def embedder(self, n_batch: int, n_seq_max: int) -> Embedder:
        """The embedding contexts on this engine's model, made on first use."""
        if self._embedder is None:
            self._embedder = Embedder(self.model, n_batch=n_batch, n_seq_max=n_seq_max, n_threads=self.info.n_threads,
                                      abort_flag=self.abort_flag)
        return self._embedder

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self.ctx:
            self.graph.detach_all()
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
