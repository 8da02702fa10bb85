"""The prefix cache below the KV cells: evicted entries' KV kept in host RAM, and on disk.

``CacheTiers`` is owned by the actor tree (``start_tree`` makes it, the supervisor hands it to
every batcher generation), so what it holds survives a batcher restart: after a crash the next
requests find their prefixes warm. Its methods run on the current batcher's thread; a lock keeps
a dying batcher's last saves apart from the next generation's first lookups. Which token
sequences it holds is a ``TierIndex`` (pure); the bytes are ``SeqState``s that the engine copies
out of the context when the prefix index evicts an entry and back when a prompt matches one.
With a ``DiskTier``, entries leaving RAM over its budget are written to disk, every entry is at a
clean shutdown (``persist``), and a prompt that matches a file better than RAM loads it into RAM.
An evicted entry is saved only when that pays (``TierCostModel``, calibrated on the engine at
start: ``calibrate``); a skipped one leaves a *ghost* (its tokens, no bytes), so that a prompt
asking for it again still counts as a reuse.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

from llamactor.base.config import Config
from llamactor.base.logging import get_logger
from llamactor.tree.tiers.disk import DiskTier, model_identity
from llamactor.base.errors import EngineError
from llamactor.native.engine import Engine
from llamactor.native.kv_state import BUILD, SeqState
from llamactor.scheduling.cell_map import CellMap
from llamactor.scheduling.cell_rent import CellRent, let_go
from llamactor.scheduling.kv_nodes import KvOp
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.tier_cost import Displaced, SaveCandidate, TierCostModel
from llamactor.scheduling.tier_index import NO_MATCH, RESTORE_MIN_GAIN, RestoreOp, TierIndex, TierMatch
from llamactor.tree.tiers.calibration import calibrate

log = get_logger("llamactor.tree.tiers.ram")

MIB = 1 << 20
GHOSTS = 1024  # skipped entries remembered (tokens only) to learn whether they come back


class CacheTiers:
    """Host-RAM entries within ``ram_bytes``, least recently used out first (to ``disk``, if any)."""

    def __init__(self, ram_bytes: int, disk: DiskTier | None = None, *, rent: bool = False) -> None:
        self.ram = TierIndex(ram_bytes)
        self.states: dict[str, tuple[str, tuple[int, ...], SeqState]] = {}  # key -> (scope, tokens, state)
        self.lock = threading.Lock()
        self.disk = disk
        self.persistent = disk is not None  # entries outlive the process
        self._keys = itertools.count()
        self.cost: TierCostModel | None = None  # made by ``calibrate_on`` at the first batcher's start
        self.charges_rent = rent  # idle entries leave the cells once keeping them costs more (``cell_rent``)
        self.rent: CellRent | None = None  # made with ``cost``
        self.ghosts = TierIndex(GHOSTS)  # one "byte" an entry: a count
        self.returning: dict[str, bool] = {}  # RAM's and the ghosts' keys -> the entry was reused before
        self.counters: dict[str, float] = {"saved": 0, "saved_tokens": 0, "restored": 0, "restored_tokens": 0,
                                           "restore_failed": 0, "dropped": 0, "save_ms": 0.0, "restore_ms": 0.0}

    @classmethod
    def for_config(cls, config: Config, model_path: str) -> CacheTiers | None:
        """The tiers ``config`` asks for (None: no prefix cache, or neither RAM nor a directory)."""
        if not config.prefix_cache or (config.cache_ram_mib == 0 and config.cache_dir is None):
            return None
        disk = None
        if config.cache_dir is not None:
            # Everything that makes saved KV valid.
            validity = {"model": model_identity(model_path), "n_ctx": config.n_ctx, "kv_type": config.kv_type,
                        "kv_unified": True, "swa_full": True, "build": BUILD}
            if config.loras:  # an adapter scope's KV is valid only with the very adapter files it ran under
                validity["loras"] = {name: _identity(path) for name, path in config.loras}
            try:
                disk = DiskTier(config.cache_dir, config.cache_dir_mib * MIB, validity)
            except OSError as e:  # an unusable directory costs the disk tier, not the service
                log.warning("disk_tier_unavailable", dir=config.cache_dir, error=str(e))
        return cls(config.cache_ram_mib * MIB, disk, rent=config.cell_rent)

    # -- batcher thread -----------------------------------------------------------------------

    def calibrate_on(self, engine: Engine) -> None:
        """The save cost model, measured on ``engine``'s empty context (once: a restarted
        batcher's engine is the same device, and the model has learned since)."""
        if self.cost is not None:
            return
        try:
            self.cost = TierCostModel(calibrate(engine))
        except (EngineError, RuntimeError) as e:  # a context too small to measure in: every eviction is saved
            log.warning("cache_tier_calibration_failed", error=str(e))
            return
        if self.charges_rent:
            self.rent = CellRent(self.cost.token_ms)
        log.info("cache_tier_calibrated", **self.cost.stats())

    def stepped(self, n_rows: int, ms: float, index: PrefixIndex, cells: CellMap) -> list[KvOp]:
        """A decode step of ``n_rows`` rows took ``ms`` (the cost model's step time and prefill rate,
        the kept cells' rent), with the cells laid as ``cells`` has them; the evictions of the
        entries whose rent is due, to carry out."""
        if self.cost is None:
            return []
        self.cost.stepped(n_rows, ms)
        if self.rent is None:
            return []
        self.rent.stepped(n_rows, ms, cells.top)
        if not self.rent.check_due():
            return []
        return let_go(index, cells, self.rent, self.cost, self._displaced())

    def _displaced(self) -> Displaced:
        """What a save into RAM pushes out now: nothing with a disk tier (it keeps what leaves RAM)
        or room to spare; else tokens like those of the least recently used entry."""
        oldest = self.ram.oldest()
        if self.disk is not None or oldest is None:
            return Displaced()
        room = (self.ram.budget_bytes - self.ram.bytes_used) * len(oldest.tokens) / max(oldest.nbytes, 1)
        return Displaced(room, self.returning.get(oldest.key, False))

    def lookup(self, scope: str, tokens: list[int]) -> TierMatch:
        """The entry of cache scope ``scope`` sharing the longest prefix with ``tokens`` (a hit
        counts as a use); a file that matches longer than RAM is loaded into RAM first."""
        with self.lock:
            match = self.ram.lookup(scope, tokens)
            if self.disk is not None:
                match = self._from_disk(scope, tokens, match)
            if match.key is not None:
                self.ram.touch(match.key)
            self._ghost_hit(scope, tokens, match.n_tokens)
            return match if match.key is not None else NO_MATCH

    def _ghost_hit(self, scope: str, tokens: list[int], n_matched: int) -> None:
        """A skipped entry that would have served ``tokens`` better than what is held: a reuse
        its class missed (counted once: the ghost goes)."""
        ghost = self.ghosts.lookup(scope, tokens)
        # Most of it, not merely a prefix it shares with other prompts (those stay in the cells).
        if (ghost.key is not None and ghost.n_tokens >= max(n_matched + RESTORE_MIN_GAIN, ghost.n_entry // 2)
                and self.cost is not None):
            self.cost.ghost_hit(self.returning.pop(ghost.key, False))
            self.ghosts.remove(ghost.key)

    def _from_disk(self, scope: str, tokens: list[int], match: TierMatch) -> TierMatch:
        """A file's entry loaded into RAM when it matches longer than ``match`` (RAM's); else ``match``."""
        assert self.disk is not None
        on_disk = self.disk.lookup(scope, tokens)
        if on_disk.key is None or on_disk.n_tokens <= match.n_tokens:
            return match
        entry_tokens = self.disk.index.entry(on_disk.key).tokens
        state = self.disk.load(on_disk.key)  # None (the file removed) when it fails any check
        if state is None or state.n_tokens != len(entry_tokens):  # load checks it: a file never breaks a lookup
            return match
        key = self._add(scope, entry_tokens, state)
        return TierMatch(on_disk.n_tokens, key, state.n_tokens) if key in self.ram else match

    def offer_entries(self, engine: Engine, index: PrefixIndex) -> None:
        """Batcher thread: save every cached prefix still in ``engine``'s cells (the context is going)."""
        for seq_id, pinned in list(index.entries.items()):
            scope = index.scopes[seq_id]
            if not pinned and scope is not None:
                self.save(engine, seq_id, scope, index.tokens(seq_id))

    def offer(self, engine: Engine, op: KvOp) -> None:
        """The prefix index evicts an entry (``op``, before its ``seq_rm``): save it when that pays
        (``TierCostModel``), else remember its ghost."""
        assert op.scope is not None and op.save
        with self.lock:
            if self._covered(op.scope, op.save):
                return
            n_runs = min(max(op.runs, 1), len(op.save))
            candidate = SaveCandidate(len(op.save), n_runs, len(op.save) - op.p0, op.returning)
            decision = self.cost.decide(candidate) if self.cost is not None else None
            if decision is not None and not decision.save:
                self._add_ghost(op.scope, op.save, op.returning)
                return
            ms = self._save(engine, op.seq_id, op.scope, op.save, op.returning)
            if ms is not None and decision is not None and self.cost is not None:
                self.cost.saved(decision, candidate, ms)

    def save(self, engine: Engine, seq_id: int, scope: str, tokens: Sequence[int]) -> None:
        """Copy the KV of ``seq_id`` (holding exactly ``tokens``, of cache scope ``scope``) into
        RAM, unless an entry of that scope already starts with those tokens, whatever it costs."""
        with self.lock:
            if not self._covered(scope, tokens):
                self._save(engine, seq_id, scope, tokens, False)

    def _covered(self, scope: str, tokens: Sequence[int]) -> bool:
        """An entry of ``scope`` starts with ``tokens`` already (touched: it is in use again)."""
        covering = self.ram.covers(scope, tokens)
        if covering is not None:
            self.ram.touch(covering)
        return covering is not None

    def _save(self, engine: Engine, seq_id: int, scope: str, tokens: Sequence[int], returning: bool) -> float | None:
        """Copy it; its milliseconds, or None on a failure (logged: it costs only the entry)."""
        t0 = time.perf_counter()
        try:
            state = engine.save_seq(seq_id, len(tokens))
        except RuntimeError as e:
            log.warning("cache_tier_save_failed", seq_id=seq_id, n_tokens=len(tokens), error=str(e))
            return None
        self.returning[self._add(scope, tuple(tokens), state)] = returning
        ms = (time.perf_counter() - t0) * 1000
        self.counters["saved"] += 1
        self.counters["saved_tokens"] += len(tokens)
        self.counters["save_ms"] += ms
        return ms

    def _add_ghost(self, scope: str, tokens: tuple[int, ...], returning: bool) -> None:
        key = f"g{next(self._keys)}"
        self.returning[key] = returning
        for gone in self.ghosts.add(key, scope, tokens, 1):
            self.returning.pop(gone, None)

    def restore(self, engine: Engine, op: RestoreOp) -> bool:
        """Carry out ``op``; False: the entry is gone or llama.cpp refused it (then dropped), and
        ``op.seq_id`` holds nothing."""
        with self.lock:
            held = self.states.get(op.key)
            t0 = time.perf_counter()
            ok = held is not None and engine.restore_seq(op.seq_id, held[2], op.scratch_id)
            if not ok:
                self.counters["restore_failed"] += 1
                if held is not None:
                    log.warning("cache_tier_restore_failed", key=op.key, n_tokens=held[2].n_tokens)
                    self.ram.remove(op.key)
                    del self.states[op.key]
                    self.returning.pop(op.key, None)
                return False
            assert held is not None
            if op.n_keep < held[2].n_tokens:
                engine.seq_rm(op.seq_id, op.n_keep, -1)
            if self.cost is not None:
                self.cost.reused(self.returning.get(op.key, False))
            self.counters["restored"] += 1
            self.counters["restored_tokens"] += op.n_keep
            self.counters["restore_ms"] += (time.perf_counter() - t0) * 1000
            return True

    def persist(self) -> None:
        """A clean shutdown: write the most recently used RAM entries that fit the disk budget."""
        with self.lock:
            if self.disk is None:
                return
            chosen, total = [], 0
            for key in self.ram.keys_by_recency():
                total += self.ram.entry(key).nbytes
                if total > self.disk.index.budget_bytes:
                    break
                chosen.append(key)
            t0 = time.perf_counter()
            for key in reversed(chosen):  # the most recent last: the newest on disk
                self._write(*self.states[key])
            log.info("cache_tier_persisted", entries=len(chosen), ms=round((time.perf_counter() - t0) * 1000, 1))

    def _add(self, scope: str, tokens: tuple[int, ...], state: SeqState) -> str:
        """Hold ``state`` in RAM; entries pushed out over the budget go to disk."""
        key = f"r{next(self._keys)}"
        self.states[key] = (scope, tokens, state)
        for gone in self.ram.add(key, scope, tokens, state.nbytes):
            gone_scope, gone_tokens, gone_state = self.states.pop(gone)
            self.returning.pop(gone, None)
            self.counters["dropped"] += 1
            extended = gone_scope == scope and tokens[:len(gone_tokens)] == gone_tokens
            if gone != key and not extended:  # not merely extended by the new one
                self._write(gone_scope, gone_tokens, gone_state)
        return key

    def _write(self, scope: str, tokens: tuple[int, ...], state: SeqState) -> None:
        if self.disk is None:
            return
        try:
            self.disk.put(scope, tokens, state)
        except OSError as e:  # a full or read-only disk costs the entry, never the request
            log.warning("disk_tier_write_failed", error=str(e), n_tokens=len(tokens))

    # -- any thread ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"entries": len(self.ram), "bytes": self.ram.bytes_used, "budget_bytes": self.ram.budget_bytes,
                    **{k: round(v, 3) if isinstance(v, float) else v for k, v in self.counters.items()},
                    **({"save_cost": self.cost.stats()} if self.cost is not None else {}),
                    **({"rent": self.rent.stats()} if self.rent is not None else {}),
                    **({"disk": self.disk.stats()} if self.disk is not None else {})}


def _identity(path: str) -> dict[str, Any] | None:
    """A file's identity, or None if it cannot be read (a missing adapter: the batcher refuses it
    at start, naming why)."""
    try:
        return model_identity(path)
    except OSError:
        return None
