"""The null-decode leg of the ``host`` workload: the real batcher with its decode recorded, or replayed.

``Recording`` keeps copies of the results a real ``Engine.decode`` returned (a few steps' rows,
262,144 floats each for Gemma) and replays them: every field of the recorded result that has one
entry per logits row (``logits``, and whatever a later ``DecodeResult`` adds, such as the tokens
llama.cpp sampled in its graph) is laid out once in a cyclic buffer, and a replayed step gets a
contiguous slice of it -- a view, as the real engine's logits are, so a replayed decode costs
nothing -- in a copy of the recorded object (``dataclasses.replace``) with no failed sequences.
Every other field is replayed as recorded.

``ReplayEngine`` stands in for ``Engine`` on the batcher thread: decodes come from the recording,
and KV operations are no-ops -- there are no cells, so the leg also runs past the sequences a
llama.cpp context holds (``null_config``; 256, or 128 on a model with sliding-window layers). Model, tokenizer and chat template are a real engine's
(a tiny context), and anything else the batcher asks of an engine is that engine's. So the leg
leaves out llama.cpp's own KV bookkeeping (``seq_cp``/``seq_rm`` at admission and finish,
microseconds each) along with the decode. Replayed rows are views of the recording: a sampler
that adjusts rows in place (bias, penalties, grammar masks) would change them for later steps;
the host workload uses none of those.

``HostBatcher`` is the real ``BatcherActor`` with either its engine's decode tapped (recording) or
its engine replaced by a ``ReplayEngine`` while ``on_start`` makes it; ``start_host_tree`` starts
a supervisor with it, as ``start_tree`` does with the plain batcher (no cache tiers, no restarts:
the benchmark wants a failure, not a recovery).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any
from unittest import mock

import numpy as np

from llamactor.tree import batcher as batcher_module
from llamactor.base.config import DEFAULT_CACHED_SEQ_IDS, MAX_SEQUENCES, PINNED_SEQ_IDS, Config
from llamactor.native.loading import SeqIds
from llamactor.base.errors import ModelLoadError
from llamactor.base.models import resolve_model_path
from llamactor.tree.batcher import BatcherActor
from llamactor.handles.llm import LLM
from llamactor.native.engine import Engine
from llamactor.tree.board import StatsBoard
from llamactor.tree.supervisor import SupervisorActor


class Recording:
    """Decode results of a real run, kept (``offer``, batcher thread) and replayed (``replay``).

    ``max_steps`` results with logits rows are kept, ``rows_per_step`` rows of each."""

    def __init__(self, max_steps: int = 4, rows_per_step: int = 16) -> None:
        self.max_steps, self.rows_per_step = max_steps, rows_per_step
        self.kept: list[Any] = []
        self._lock = threading.Lock()  # offered on one tree's batcher thread, replayed on another's
        self._buffers: dict[str, np.ndarray] = {}
        self._offset = 0

    @property
    def full(self) -> bool:
        return len(self.kept) >= self.max_steps

    @property
    def n_rows(self) -> int:
        """Distinct rows a replay cycles through."""
        return sum(_n_rows(r) for r in self.kept)

    def offer(self, result: Any) -> None:
        """Keep a copy of ``result``'s first rows until ``max_steps`` are kept (a view of llama.cpp's
        logits buffer would change under us)."""
        n = _n_rows(result)
        if self.full or n == 0:
            return
        keep = min(n, self.rows_per_step)
        with self._lock:
            self.kept.append(dataclasses.replace(result, **{
                name: value[:keep].copy() for name, value in _row_fields(result, n).items()}))
            self._buffers.clear()

    def prepare(self, max_rows: int) -> None:
        """Lay out the buffers for steps of up to ``max_rows`` rows now (caller's thread), so that
        no replayed step pays for it (320 MiB for 256 Gemma rows)."""
        with self._lock:
            self._ensure(max_rows)

    def _ensure(self, n_rows: int) -> None:
        if not self.kept:
            raise RuntimeError("nothing was recorded to replay")
        if not self._buffers or len(next(iter(self._buffers.values()))) < self.n_rows + n_rows:
            self._buffers = cyclic_buffers(self.kept, self.n_rows + n_rows)

    def replay(self, n_rows: int) -> Any:
        """A decode result with ``n_rows`` rows: the next rows of the recording, cyclically."""
        with self._lock:
            self._ensure(n_rows)  # a no-op once prepared
            template, pool = self.kept[0], self.n_rows
            start = self._offset
            self._offset = (self._offset + n_rows) % pool
        views = {name: buffer[start:start + n_rows] for name, buffer in self._buffers.items()}
        return dataclasses.replace(template, failed_seq_ids=frozenset(), **views)


def _n_rows(result: Any) -> int:
    return len(result.logits)


def _row_fields(result: Any, n_rows: int) -> dict[str, np.ndarray]:
    """The fields of a decode result that hold one entry per logits row."""
    out = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == n_rows:
            out[f.name] = value
    return out


def cyclic_buffers(kept: list[Any], length: int) -> dict[str, np.ndarray]:
    """Each per-row field of the kept results, concatenated and repeated to ``length`` rows."""
    names = _row_fields(kept[0], _n_rows(kept[0])).keys()
    out = {}
    for name in names:
        pool = np.concatenate([getattr(r, name) for r in kept])
        out[name] = pool[np.arange(length) % len(pool)]
    return out


UNBOUNDED = 1 << 20  # the sequence ids a replay engine holds: as many as asked


class ReplayEngine:
    """``Engine``'s stand-in for the null-decode leg (batcher thread): the real model and tokenizer
    on a tiny context, the sizes the batcher asked for, decodes from ``recording``, no KV."""

    def __init__(self, recording: Recording, model_path: str, *, n_ctx: int, n_batch: int, n_ubatch: int,
                 n_seq_max: SeqIds, n_threads: int, chat_template: str | None = None,
                 graph_sampling: bool | None = None, **_: Any) -> None:
        self.recording = recording
        # Graph sampling as the recorded leg had it: replayed tokens are accepted into real chains.
        self._real = Engine(model_path, n_ctx=256, n_batch=32, n_ubatch=32, n_seq_max=1, n_threads=n_threads,
                            chat_template=chat_template, graph_sampling=graph_sampling)
        # No llama.cpp context holds the sequences: the model's most does not bind them.
        seq_ids = n_seq_max(UNBOUNDED, "the replayed model") if callable(n_seq_max) else n_seq_max
        self.info = dataclasses.replace(self._real.info, n_ctx=n_ctx, n_ctx_seq=n_ctx, n_batch=n_batch,
                                        n_ubatch=n_ubatch, n_seq_max=seq_ids)
        self.test_hang = None
        self.seq_state_supported = False  # no cells to save: no cache tiers

    def __getattr__(self, name: str) -> Any:
        # Only for what is not defined here (tokenizer, chat template, abort flag, n_vocab, ...).
        return getattr(self._real, name)

    def decode(self, token: np.ndarray, pos: np.ndarray, seq_id: np.ndarray, logits: np.ndarray) -> Any:
        return self.recording.replay(int(np.count_nonzero(logits)))

    def decode_batch(self, entries: list[tuple[int, int, int]]) -> Any:
        return self.recording.replay(len(entries))

    def launch(self, token: np.ndarray, pos: np.ndarray, seq_id: np.ndarray, logits: np.ndarray) -> Any:
        return self.decode(token, pos, seq_id, logits)

    def collect(self, launched: Any) -> Any:
        return launched

    def prefill(self, seq_id: int, tokens: list[int], n_past: int = 0) -> None:
        pass

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        pass

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        pass

    def clear(self) -> None:
        pass

    def close(self) -> None:
        self._real.close()


class HostBatcher(BatcherActor):
    """The batcher with its decode recorded into ``recording`` (``replay`` False) or replayed from it."""

    def __init__(self, *args: Any, recording: Recording, replay: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recording, self.replay = recording, replay

    def on_start(self) -> None:
        """Batcher thread: start as the real batcher does, on a replay engine or with a tapped decode."""
        if self.replay:
            # The batcher makes its engine in on_start; only one tree starts at a time in the bench.
            with mock.patch.object(batcher_module, "Engine", functools.partial(ReplayEngine, self.recording)):
                super().on_start()
            if not isinstance(self.engine, ReplayEngine):  # a null leg that decodes for real would mislead
                raise RuntimeError("the batcher no longer makes its engine as llamactor.tree.batcher.Engine(...)")
            return
        super().on_start()
        # Every decode's results pass ``collect``: the serial loop's ``decode`` (launch, then
        # collect) and the overlapped loop's own launch and collect, which a GPU build runs.
        collect = self.engine.collect

        def recorded(*args: Any) -> Any:
            result = collect(*args)
            self.recording.offer(result)
            return result
        setattr(self.engine, "collect", recorded)  # an instance attribute: shadows the method


def null_config(n_sequences: int, **options: Any) -> Config:
    """A Config of ``n_sequences`` for the replay engine, past MAX_SEQUENCES when asked: the limit is
    llama.cpp's (its 256 sequence ids), and no llama.cpp context holds these."""
    config = Config(n_parallel=min(n_sequences, MAX_SEQUENCES - PINNED_SEQ_IDS), **options)
    if n_sequences > config.n_parallel:  # frozen and validated: set past the check on purpose
        object.__setattr__(config, "n_parallel", n_sequences)
        object.__setattr__(config, "n_seq_ids", n_sequences + PINNED_SEQ_IDS + max(n_sequences, DEFAULT_CACHED_SEQ_IDS))
        object.__setattr__(config, "n_batch", max(config.n_batch, n_sequences))
        object.__setattr__(config, "max_queue", max(config.max_queue, 2 * n_sequences))
    return config


def start_host_tree(config: Config, recording: Recording, *, replay: bool, timeout_s: float = 300.0) -> LLM:
    """One tree whose batcher is a ``HostBatcher``; blocks until it is ready (caller's thread)."""
    return start_batcher_tree(config, functools.partial(HostBatcher.start, recording=recording, replay=replay),
                              timeout_s)


def start_batcher_tree(config: Config, start: Any, timeout_s: float = 300.0) -> LLM:
    """One tree whose batcher ``start`` starts (a ``BatcherActor.start`` with its extra arguments)."""
    board = StatsBoard()
    supervisor = SupervisorActor.start(config, resolve_model_path(config.model), start, board, None)
    proxy = supervisor.proxy()
    if not proxy.ready.get().wait(timeout_s) or proxy.state.get() != "ready":
        reason = proxy.failure_reason.get()
        supervisor.stop()
        raise ModelLoadError(reason or "the benchmark's batcher could not start")
    return LLM(supervisor, config, proxy.info.get(), board)
