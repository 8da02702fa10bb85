"""The engine's cell map (``scheduling/cell_map.py``) against llama.cpp's own account of its cells.

With ``LLAMA_KV_CACHE_DEBUG`` set when a context is made, llama.cpp logs, before it places every
ubatch, ``find_slot: stream[0], n = <one past the highest cell in use>, used = <cells in use>,
head = <head>``. A seeded run of every KV operation the engine issues (prefills over several ubatches,
multi-sequence decode steps, trims, copies, saves and restores, clears) must find the mirror's
figures equal to those before every decode and restore."""

from __future__ import annotations

import ctypes
import random
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import llama_cpp
import numpy as np
import pytest

from llamactor.base.models import instruct_model_path
from llamactor.native.engine import Engine
from llamactor.native.loading import init_backend

# The full-attention cache's line (Gemma 3's sliding-window cache logs its own, with n_swa > 0).
FIND_SLOT = re.compile(r"find_slot: stream\[0\], n = *(\d+), used = *(\d+), head = *(\d+), size = *\d+, n_swa = *0\s*$")
N_SEQS = 6


class FindSlotLog:
    """llama.cpp's (n, used, head) lines, from a context made while ``LLAMA_KV_CACHE_DEBUG`` is set."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, ...]] = []

        @llama_cpp.llama_log_callback
        def collect(level: int, text: bytes, user_data: Any) -> None:
            if (m := FIND_SLOT.search(text.decode(errors="replace"))) is not None:
                self.lines.append(tuple(int(g) for g in m.groups()))

        self._collect = collect  # kept alive while llama.cpp may call it

    def listen(self) -> None:
        """From now on (after the engine is made: loading installs llamactor's quiet log)."""
        llama_cpp.llama_log_set(self._collect, ctypes.c_void_p(0))


@pytest.fixture
def find_slot_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[FindSlotLog]:
    monkeypatch.setenv("LLAMA_KV_CACHE_DEBUG", "1")  # read by llama.cpp when it makes a KV cache
    log = FindSlotLog()
    try:
        yield log
    finally:
        init_backend()  # llamactor's quiet log again


class Checked:
    """Runs KV operations on ``engine``, comparing the mirror with llama.cpp's log at each placement."""

    def __init__(self, engine: Engine, log: FindSlotLog) -> None:
        log.listen()
        self.engine, self.logged = engine, log.lines
        self.n_past = [0] * N_SEQS
        self.checked: Counter[str] = Counter()  # placements checked, by operation
        self.highest = 0  # the highest top cell seen
        self.text = engine.tokenizer.tokenize("the weather at sea was calm and grey " * 40, add_special=False)

    def placing(self, what: str, run: Any) -> None:
        """``run`` places cells: the first line it logs must be the mirror's figures before it."""
        cells = self.engine.cells
        expected = (cells.top, cells.used, cells.head)
        before = len(self.logged)
        run()
        assert self.logged[before:], "llama.cpp logged no find_slot"
        assert self.logged[before] == expected, f"placement {self.checked.total()} ({what})"
        self.checked[what] += 1
        self.highest = max(self.highest, expected[0])

    def prefill(self, seq_id: int, n: int) -> None:
        self.placing("prefill", lambda: self.engine.prefill(seq_id, self.text[:n], self.n_past[seq_id]))
        self.n_past[seq_id] += n

    def step(self, seq_ids: list[int]) -> None:
        """One token more for each of ``seq_ids``, in one decode."""
        pos = np.array([self.n_past[s] for s in seq_ids], dtype=np.int32)
        self.placing("step", lambda: self.engine.decode(np.full(len(seq_ids), 42, np.int32), pos,
                                                np.array(seq_ids, np.int32), np.ones(len(seq_ids), np.int8)))
        for s in seq_ids:
            self.n_past[s] += 1

    def trim(self, seq_id: int, keep: int) -> None:
        self.engine.seq_rm(seq_id, keep, -1)
        self.n_past[seq_id] = keep

    def copy(self, src: int, dst: int, n: int) -> None:
        self.trim(dst, 0)
        self.engine.seq_cp(src, dst, 0, n)
        self.n_past[dst] = n

    def save_and_restore(self, src: int, dst: int, scratch: int) -> None:
        """``src``'s state saved, ``src`` dropped, the state restored into the empty ``dst``."""
        state = self.engine.save_seq(src, self.n_past[src])
        for s in (src, dst, scratch):
            self.trim(s, 0)
        self.placing("restore", lambda: self.engine.restore_seq(dst, state, scratch))
        self.n_past[dst] = state.n_tokens


def random_operations(checked: Checked, seed: int, n_ops: int) -> None:
    rng = random.Random(seed)
    n_cells = checked.engine.info.n_ctx
    for _ in range(n_ops):
        op = rng.choice(["prefill", "prefill", "step", "step", "trim", "copy", "restore", "restore", "drop", "drop"])
        live = [s for s in range(N_SEQS) if checked.n_past[s] > 0]
        empty = [s for s in range(N_SEQS) if checked.n_past[s] == 0]
        room = n_cells - checked.engine.cells.used
        if op == "prefill" and room > 64:
            checked.prefill(rng.randrange(N_SEQS), rng.randint(1, min(room - 32, 200)))
        elif op == "step" and live and room > N_SEQS:
            checked.step(rng.sample(live, rng.randint(1, len(live))))
        elif op == "trim" and live:
            s = rng.choice(live)
            checked.trim(s, rng.randrange(checked.n_past[s]))
        elif op == "copy" and live and empty:
            s = rng.choice(live)
            checked.copy(s, rng.choice(empty), rng.randint(1, checked.n_past[s]))
        elif op == "restore" and live and len(empty) >= 2:  # the saved sequence leaves its cells first
            dst, scratch = rng.sample(empty, 2)
            checked.save_and_restore(rng.choice(live), dst, scratch)
        elif op == "drop" and live:
            checked.trim(rng.choice(live), 0)
        if rng.random() < 0.02:
            checked.engine.clear()
            checked.n_past = [0] * N_SEQS


@pytest.mark.parametrize("which", ["gemma3", "smollm2"])
def test_the_cell_map_has_llama_cpps_top_cells_in_use_and_head_before_every_placement(
        which: str, model_path: str, find_slot_log: FindSlotLog) -> None:
    path = model_path if which == "gemma3" else instruct_model_path()
    engine = Engine(path, n_ctx=1024, n_batch=256, n_ubatch=64, n_seq_max=N_SEQS, n_threads=2)
    try:
        checked = Checked(engine, find_slot_log)
        random_operations(checked, seed=7, n_ops=160)
        assert min(checked.checked[k] for k in ("prefill", "step", "restore")) >= 10 and engine.cells.drifted == 0
        assert checked.highest > engine.info.n_ctx // 2  # the run filled the cache well beyond its first cells
    finally:
        engine.close()
