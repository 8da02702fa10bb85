"""The pure prefix index, without llama.cpp: unit tests and a property test against a brute-force model.

The model is llama.cpp's unified cache reduced to its semantics: every sequence is a list of cell
ids (one per position); ``seq_cp(src, dst, 0, n)`` gives ``dst`` the first ``n`` cells of ``src``,
``seq_rm(s, p0)`` drops ``s``'s cells from ``p0`` on; a cell is in use while any sequence has it.
The index's ``KvOp``s are replayed on the model, so the test checks that what the index believes
is what llama.cpp would hold.
"""

from __future__ import annotations

import itertools
import random

import pytest

from llamactor.scheduling.kv_nodes import KvOp, Match, descendants
from llamactor.scheduling.prefix_index import PrefixIndex

pytestmark = pytest.mark.pure


class CellModel:
    def __init__(self) -> None:
        self.cells: dict[int, list[int]] = {}  # seq_id -> cell ids by position
        self.token_of: dict[int, int] = {}
        self._ids = itertools.count()

    def apply(self, ops: list[KvOp]) -> None:
        for op in ops:
            if op.src >= 0:
                assert op.seq_id not in self.cells, "seq_cp into a sequence that is not empty"
                self.cells[op.seq_id] = self.cells[op.src][:op.p0]
            elif op.p0 == 0:
                self.cells.pop(op.seq_id, None)
            else:
                self.cells[op.seq_id] = self.cells[op.seq_id][:op.p0]

    def compute(self, seq_id: int, tokens: list[int]) -> None:
        for t in tokens:
            cell = next(self._ids)
            self.token_of[cell] = t
            self.cells.setdefault(seq_id, []).append(cell)

    def tokens(self, seq_id: int) -> list[int]:
        return [self.token_of[c] for c in self.cells.get(seq_id, [])]

    def used(self) -> int:
        return len({c for cells in self.cells.values() for c in cells})


def admit(index: PrefixIndex, model: CellModel, tokens: list[int], now: float, *, compute: bool = True,
          scope: str = "default") -> int:
    """What the scheduler does: allocate, look up, attach, then compute the rest of the prompt."""
    seq_id, ops = index.allocate(scope)
    model.apply(ops)
    match = index.lookup(tokens, scope=scope)
    model.apply(index.attach(seq_id, match, now))
    if compute:
        index.extend(seq_id, tokens[match.n_tokens:], now)
        model.compute(seq_id, tokens[match.n_tokens:])
    return seq_id


def assert_consistent(index: PrefixIndex, model: CellModel) -> None:
    assert index.cells_used == model.used()
    assert set(index.leaf) >= set(model.cells)
    for seq_id in index.leaf:
        assert index.tokens(seq_id) == model.tokens(seq_id)
    for seq_id in model.cells:  # shared cells are really shared: same cell ids along common prefixes
        assert index.length(seq_id) == len(model.cells[seq_id])
    assert set(index.free_ids).isdisjoint(index.leaf)


def test_a_finished_sequence_is_found_again_by_its_longest_common_prefix() -> None:
    index, model = PrefixIndex(n_seq_ids=4, n_cells=100), CellModel()
    a = admit(index, model, [1, 2, 3, 4, 5], 1.0)
    assert index.finish(a, 2.0, keep=True) == []
    assert index.lookup([1, 2, 3, 9]) == Match(3, a)
    assert index.lookup([7]) == Match(0, -1)
    b = admit(index, model, [1, 2, 3, 9], 3.0)
    assert index.tokens(b) == [1, 2, 3, 9] and index.cells_used == 6  # 3 cells shared, 1 new
    assert_consistent(index, model)


def test_an_entry_that_a_newer_one_extends_is_dropped_and_its_seq_id_freed() -> None:
    index, model = PrefixIndex(n_seq_ids=4, n_cells=100), CellModel()
    turn1 = admit(index, model, [1, 2, 3], 1.0)
    model.apply(index.finish(turn1, 1.5, keep=True))
    turn2 = admit(index, model, [1, 2, 3, 4, 5], 2.0)
    ops = index.finish(turn2, 2.5, keep=True)
    model.apply(ops)
    assert ops == [KvOp(turn1)] and list(index.entries) == [turn2]
    assert index.cells_used == 5
    assert_consistent(index, model)


def test_pinned_entries_are_never_evicted_and_lookups_may_be_limited_to_them() -> None:
    index, model = PrefixIndex(n_seq_ids=4, n_cells=100), CellModel()
    system = admit(index, model, [1, 2, 3], 0.0)
    index.pin(system)
    other = admit(index, model, [1, 2, 3, 4, 5, 6], 1.0)
    model.apply(index.finish(other, 1.0, keep=True))
    assert index.lookup([1, 2, 3, 4, 5], pinned_only=True) == Match(3, system)
    model.apply(index.evict(100))
    assert system in index.entries and other not in index.entries
    assert index.cells_used == 3
    assert_consistent(index, model)


def test_eviction_trims_the_least_recently_used_tail_before_dropping_whole_entries() -> None:
    index, model = PrefixIndex(n_seq_ids=4, n_cells=100), CellModel()
    old = admit(index, model, list(range(10, 20)), 1.0)
    model.apply(index.finish(old, 1.0, keep=True))
    new = admit(index, model, list(range(30, 40)), 2.0)
    model.apply(index.finish(new, 2.0, keep=True))
    ops = index.evict(4)
    model.apply(ops)
    assert ops == [KvOp(old, 6)]
    assert index.tokens(old) == list(range(10, 16)) and index.length(new) == 10
    ops = index.evict(8)  # the rest of `old` (6) is not enough: it goes, and `new` loses 2
    model.apply(ops)
    assert ops == [KvOp(old), KvOp(new, 8)]
    assert index.counters["evicted_entries"] == 1 and index.counters["evicted_cells"] == 12
    assert_consistent(index, model)


def test_running_sequences_and_cells_they_share_are_never_evicted() -> None:
    index, model = PrefixIndex(n_seq_ids=4, n_cells=100), CellModel()
    cached = admit(index, model, [1, 2, 3, 4], 1.0)
    model.apply(index.finish(cached, 1.0, keep=True))
    running = admit(index, model, [1, 2, 3, 4, 5, 6], 2.0)  # shares cached's 4 cells
    assert index.evict(100) == []  # cached owns nothing alone
    assert index.tokens(running) == [1, 2, 3, 4, 5, 6] and index.cache_cells() == 0
    assert_consistent(index, model)


def test_idle_entries_are_the_unpinned_ones_holding_cells_alone_and_evicting_them_frees_those() -> None:
    index, model = PrefixIndex(n_seq_ids=6, n_cells=100, offer_evicted=True), CellModel()
    pinned = admit(index, model, [9, 9, 9], 0.5)
    index.pin(pinned)
    shared = admit(index, model, [1, 2, 3, 4], 1.0)
    model.apply(index.finish(shared, 1.0, keep=True))
    alone = admit(index, model, [7, 8, 7, 8, 7], 1.5)
    model.apply(index.finish(alone, 1.5, keep=True))
    running = admit(index, model, [1, 2, 3, 4, 5, 6], 2.0)  # holds all of shared's cells
    idle = index.idle_entries()
    assert [(e.seq_id, e.own_cells, e.last_used, e.n_tokens, e.runs) for e in idle] == [(alone, 5, 1.5, 5, 1)]
    ops = index.evict_entries([e.seq_id for e in idle])
    assert [(op.seq_id, op.save) for op in ops] == [(alone, (7, 8, 7, 8, 7))]
    model.apply(ops)
    assert index.tokens(running) == [1, 2, 3, 4, 5, 6] and alone not in index.entries and pinned in index.entries
    assert_consistent(index, model)


def test_allocation_with_every_seq_id_taken_drops_a_covered_entry_first_then_the_least_recent() -> None:
    index, model = PrefixIndex(n_seq_ids=3, n_cells=100), CellModel()
    a = admit(index, model, [1, 2], 1.0)
    model.apply(index.finish(a, 1.0, keep=True))
    b = admit(index, model, [5, 6], 2.0)
    model.apply(index.finish(b, 2.0, keep=True))
    running = admit(index, model, [1, 2, 3], 3.0)  # covers a
    c, ops = index.allocate()
    model.apply(ops)
    assert ops == [KvOp(a)] and c == a and index.tokens(running) == [1, 2, 3]
    assert index.lookup([1, 2]) == Match(2, running)
    assert_consistent(index, model)


def test_a_finish_without_keep_and_a_failed_sequence_free_their_cells() -> None:
    index, model = PrefixIndex(n_seq_ids=3, n_cells=100), CellModel()
    a = admit(index, model, [1, 2, 3], 1.0)
    model.apply(index.finish(a, 1.0, keep=False))
    b = admit(index, model, [4, 5], 1.0)
    model.cells.pop(b)  # llama.cpp removed it itself
    index.release(b)
    assert index.cells_used == 0 and sorted(index.free_ids) == [0, 1, 2]
    assert_consistent(index, model)


def test_a_finished_sequence_kept_up_to_its_shared_context_frees_its_own_tail() -> None:
    index, model = PrefixIndex(n_seq_ids=6, n_cells=100), CellModel()
    context = [1, 2, 3]
    first = admit(index, model, context + [4, 5, 6], 1.0)  # a rerank's first document
    second = admit(index, model, context + [7, 8], 1.0)  # the second attaches the context
    assert index.cells_used == 8
    ops = index.finish(first, 2.0, keep=True, keep_upto=3)
    model.apply(ops)
    assert ops == [KvOp(first, 3)] and index.cells_used == 5  # its document's cells freed at once
    assert index.lookup(context + [9]) == Match(3, first) and index.lookup(context + [4]).n_tokens == 3
    model.apply(index.finish(second, 3.0, keep=True, keep_upto=3))  # the same context: one entry holds it
    assert index.cells_used == 3 and len(index.entries) == 1
    third = admit(index, model, [1, 2, 9], 4.0)  # a tail shorter than the context kept is trimmed to it
    model.apply(index.finish(third, 5.0, keep=True, keep_upto=1))
    assert index.cells_used == 3 and index.lookup([1, 2, 9]).n_tokens == 2
    assert_consistent(index, model)


@pytest.mark.parametrize("seed", range(60))
def test_random_operations_keep_the_index_equal_to_the_cells_llama_cpp_would_hold(seed: int) -> None:
    rng = random.Random(seed)
    n_ids = rng.randint(3, 8)
    index, model = PrefixIndex(n_seq_ids=n_ids, n_cells=10_000), CellModel()
    pinned = admit(index, model, [rng.randint(0, 2) for _ in range(rng.randint(1, 4))], 0.0, scope=None)  # type: ignore[arg-type]
    index.pin(pinned)
    scopes: dict[int, str] = {}  # two tenants share the engine: each sees its own sequences and the pinned one
    running: set[int] = set()
    now = 0.0

    def random_tokens() -> list[int]:  # a tiny alphabet: prefixes collide often
        return [rng.randint(0, 2) for _ in range(rng.randint(1, 9))]

    for _ in range(120):
        now += 1.0
        action = rng.random()
        if action < 0.35 and len(running) < n_ids - 2:
            query, scope = random_tokens(), rng.choice("ab")
            expected = max((sum(1 for _ in itertools.takewhile(lambda p: p[0] == p[1], zip(model.tokens(s), query)))
                            for s in model.cells if s == pinned or scopes.get(s) == scope), default=0)
            assert index.lookup(query, scope=scope).n_tokens == expected
            seq_id = admit(index, model, query, now, scope=scope)
            running.add(seq_id)
            scopes[seq_id] = scope
        elif action < 0.6 and running:
            seq_id = rng.choice(sorted(running))
            tokens = random_tokens()
            index.extend(seq_id, tokens, now)
            model.compute(seq_id, tokens)
        elif action < 0.85 and running:
            seq_id = rng.choice(sorted(running))
            running.discard(seq_id)
            model.apply(index.finish(seq_id, now, keep=rng.random() < 0.8, budget_cells=rng.choice([None, 5, 20]),
                                     keep_upto=rng.choice([None, None, 0, 2, 5])))
        else:
            before = {s: model.tokens(s) for s in running}
            evictable = index.cache_cells()
            wanted = rng.randint(1, 15)
            used = model.used()
            model.apply(index.evict(wanted))
            assert used - model.used() >= min(wanted, evictable)
            assert {s: model.tokens(s) for s in running} == before  # running sequences lose nothing
        assert_consistent(index, model)
        assert pinned in index.entries and model.tokens(pinned) == index.tokens(pinned)


def test_a_scope_never_sees_another_scopes_prefixes_but_every_scope_sees_the_pinned_one() -> None:
    index, model = PrefixIndex(n_seq_ids=6, n_cells=100, offer_evicted=True), CellModel()
    system = admit(index, model, [9, 9], 0.0, scope=None)  # type: ignore[arg-type]
    index.pin(system)
    alice = admit(index, model, [9, 9, 1, 2, 3, 4], 1.0, scope="alice")
    index.finish(alice, 2.0, keep=True)
    assert index.lookup([9, 9, 1, 2, 3, 5], scope="alice") == Match(5, alice)
    assert index.lookup([9, 9, 1, 2, 3, 5], scope="bob") == Match(2, system)  # the system prompt alone
    bob = admit(index, model, [9, 9, 1, 2, 3, 5], 3.0, scope="bob")
    assert index.cells_used == 2 + 4 + 4  # bob computed his own copy of what alice has
    index.finish(bob, 4.0, keep=True)
    assert index.lookup([9, 9, 1, 2, 3, 5], scope="bob") == Match(6, bob)
    assert {op.scope for op in index.evict(100)} == {"alice", "bob"}  # what goes to a lower tier stays scoped


def reference_lookup(index: PrefixIndex, tokens: list[int], scope: str, pinned_only: bool, shared: bool) -> Match:
    """``lookup`` by its definition: the deepest node on ``tokens``' path that a visible sequence
    holds (a pinned entry, unless not ``shared``; one of ``scope``, unless ``pinned_only``)."""
    def visible(s: int) -> bool:
        return (shared and bool(index.entries.get(s))) or (not pinned_only and index.scopes.get(s) == scope)

    best_n, best_ids, stack = 0, set(), [index.root]
    while stack:
        for child in stack.pop().children:
            ids = {s for s in child.seq_ids if visible(s)}
            n = child.start + sum(1 for _ in itertools.takewhile(
                lambda p: p[0] == p[1], zip(child.tokens, tokens[child.start:child.end])))
            if ids and child.start < len(tokens) and n > best_n:
                best_n, best_ids = n, ids
            if ids and child.start < len(tokens) and n == child.end:
                stack.append(child)
    return Match(best_n, min(best_ids) if best_n else -1)


@pytest.mark.parametrize("seed", range(40))
def test_lookups_and_cell_counts_agree_with_their_definitions(seed: int) -> None:
    """``lookup`` gathers the visible seq_ids once per call, and the cell counts walk the tree
    once: the same answers as testing each id of each node."""
    rng = random.Random(seed)
    index, model = PrefixIndex(n_seq_ids=8, n_cells=10_000), CellModel()
    index.pin(admit(index, model, [rng.randint(0, 2) for _ in range(rng.randint(1, 4))], 0.0, scope=None))  # type: ignore[arg-type]
    running: list[int] = []
    for step in range(80):
        tokens = [rng.randint(0, 2) for _ in range(rng.randint(1, 9))]
        if len(running) < 5 and rng.random() < 0.5:
            running.append(admit(index, model, tokens, float(step), scope=rng.choice("ab")))
        elif running:
            seq_id = running.pop(rng.randrange(len(running)))
            model.apply(index.finish(seq_id, float(step), keep=rng.random() < 0.8))
        for scope, pinned_only, shared in itertools.product("ab", (False, True), (False, True)):
            assert index.lookup(tokens, scope=scope, pinned_only=pinned_only, shared=shared) == \
                reference_lookup(index, tokens, scope, pinned_only, shared)
        nodes = list(descendants(index.root))
        assert index.cache_cells() == sum(len(n.tokens) for n in nodes
                                          if all(index.entries.get(s) is False for s in n.seq_ids))
        assert index.pinned_cells() == sum(len(n.tokens) for n in nodes if any(index.entries.get(s) for s in n.seq_ids))
