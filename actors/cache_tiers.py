"""The prefix cache below the KV cells: evicted entries' KV kept in host RAM (and on disk).

``CacheTiers`` is owned by the actor tree (``start_tree`` makes it, the supervisor hands it to
every batcher generation), so what it holds survives a batcher restart: after a crash the next
requests find their prefixes warm. Its methods run on the current batcher's thread; a lock keeps
a dying batcher's last saves apart from the next generation's first lookups. Which token
sequences it holds is a ``TierIndex`` (pure); the bytes are ``SeqState``s that the engine copies
out of the context when the prefix index evicts an entry and back when a prompt matches one.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

from llamactor.base.config import Config
from llamactor.base.logging import get_logger
from llamactor.native.engine import Engine
from llamactor.native.kv_state import SeqState
from llamactor.scheduling.tier_index import NO_MATCH, RestoreOp, TierIndex, TierMatch

log = get_logger("llamactor.cache_tiers")

MIB = 1 << 20


class CacheTiers:
    """Host-RAM entries within ``ram_bytes``, least recently used out first."""

    def __init__(self, ram_bytes: int) -> None:
        self.ram = TierIndex(ram_bytes)
        self.states: dict[str, SeqState] = {}
        self.lock = threading.Lock()
        self.persistent = False  # entries outlive the process (a disk tier)
        self._keys = itertools.count()
        self.counters: dict[str, float] = {"saved": 0, "saved_tokens": 0, "restored": 0, "restored_tokens": 0,
                                           "restore_failed": 0, "dropped": 0, "save_ms": 0.0, "restore_ms": 0.0}

    @classmethod
    def for_config(cls, config: Config) -> CacheTiers | None:
        """The tiers ``config`` asks for (None: no prefix cache, or ``cache_ram_mib=0``)."""
        if not config.prefix_cache or config.cache_ram_mib == 0:
            return None
        return cls(config.cache_ram_mib * MIB)

    # -- batcher thread -----------------------------------------------------------------------

    def lookup(self, tokens: list[int]) -> TierMatch:
        """The entry sharing the longest prefix with ``tokens`` (a hit counts as a use)."""
        with self.lock:
            match = self.ram.lookup(tokens)
            if match.key is not None:
                self.ram.touch(match.key)
            return match if match.key is not None else NO_MATCH

    def save(self, engine: Engine, seq_id: int, tokens: Sequence[int]) -> None:
        """Copy the KV of ``seq_id`` (holding exactly ``tokens``) into the tier, unless an entry
        already starts with those tokens. A failure is logged and costs only the entry."""
        with self.lock:
            covering = self.ram.covers(tokens)
            if covering is not None:
                self.ram.touch(covering)
                return
            t0 = time.perf_counter()
            try:
                state = engine.save_seq(seq_id, len(tokens))
            except RuntimeError as e:
                log.warning("cache_tier_save_failed", seq_id=seq_id, n_tokens=len(tokens), error=str(e))
                return
            key = f"r{next(self._keys)}"
            self.states[key] = state
            for gone in self.ram.add(key, tokens, state.nbytes):
                del self.states[gone]
                self.counters["dropped"] += 1
            self.counters["saved"] += 1
            self.counters["saved_tokens"] += len(tokens)
            self.counters["save_ms"] += (time.perf_counter() - t0) * 1000

    def restore(self, engine: Engine, op: RestoreOp) -> bool:
        """Carry out ``op``; False: the entry is gone or llama.cpp refused it (then dropped), and
        ``op.seq_id`` holds nothing."""
        with self.lock:
            state = self.states.get(op.key)
            t0 = time.perf_counter()
            ok = state is not None and engine.restore_seq(op.seq_id, state, op.scratch_id)
            if not ok:
                self.counters["restore_failed"] += 1
                if state is not None:
                    log.warning("cache_tier_restore_failed", key=op.key, n_tokens=state.n_tokens)
                    self.ram.remove(op.key)
                    del self.states[op.key]
                return False
            assert state is not None
            if op.n_keep < state.n_tokens:
                engine.seq_rm(op.seq_id, op.n_keep, -1)
            self.counters["restored"] += 1
            self.counters["restored_tokens"] += op.n_keep
            self.counters["restore_ms"] += (time.perf_counter() - t0) * 1000
            return True

    # -- any thread ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"entries": len(self.ram), "bytes": self.ram.bytes_used, "budget_bytes": self.ram.budget_bytes,
                    **{k: round(v, 3) if isinstance(v, float) else v for k, v in self.counters.items()}}
