"""The lower cache tier's pure parts: its index (longest prefix, redundancy, LRU within a byte
budget), the restore rule, and how the scheduler plans restores and offers evicted entries.
The real engine's side is tests/tree/test_cache_tiers.py."""

from __future__ import annotations

import pytest

from llamactor.scheduling.kv_nodes import KvOp
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.tier_index import RestoreOp, TierIndex, TierMatch, restore_pays

from tests.support.scheduling import make_scheduler, make_seq, run_to_end

pytestmark = pytest.mark.pure


def test_a_lookup_finds_the_entry_sharing_the_longest_prefix_among_many() -> None:
    index = TierIndex(10_000)
    index.add("a", "t", [1, 2, 3, 4], 10)
    index.add("b", "t", [1, 2, 7, 8, 9], 10)
    index.add("c", "t", [1, 5], 10)
    index.add("d", "t", [2, 2, 2], 10)
    index.add("other", "u", [1, 2, 7, 8, 0], 10)  # another scope's: never seen from "t"
    assert index.lookup("t", [1, 2, 7, 8, 0]) == TierMatch(4, "b", 5)
    assert index.lookup("t", [1, 2, 3, 4, 5, 6]) == TierMatch(4, "a", 4)
    assert index.lookup("t", [1, 2, 6]) in (TierMatch(2, "a", 4), TierMatch(2, "b", 5))
    assert index.lookup("t", [3]) == TierMatch(0) and index.lookup("v", [1, 2]) == TierMatch(0)
    assert index.covers("t", [1, 2, 7]) == "b" and index.covers("t", [1, 2, 7, 8, 9, 10]) is None
    assert index.lookup("u", [1, 2, 7, 8, 0]) == TierMatch(5, "other", 5) and index.covers("u", [1, 2, 3]) is None


def test_an_entry_that_extends_others_replaces_them() -> None:
    index = TierIndex(10_000)
    index.add("turn1", "t", [1, 2, 3], 30)
    index.add("other", "t", [1, 9], 20)
    index.add("theirs", "u", [1, 2, 3], 30)  # the same tokens in another scope: not made redundant
    assert index.add("turn2", "t", [1, 2, 3, 4, 5], 50) == ["turn1"]
    assert "turn1" not in index and "theirs" in index and index.bytes_used == 100 and len(index) == 3


def test_over_its_budget_the_least_recently_used_entries_leave_first() -> None:
    index = TierIndex(100)
    index.add("a", "t", [1], 40)
    index.add("b", "t", [2], 40)
    index.touch("a")
    assert index.add("c", "t", [3], 40) == ["b"]
    assert index.keys_by_recency() == ["c", "a"]
    assert index.add("huge", "t", [4], 500) == ["a", "c", "huge"]  # alone over the budget: it goes too
    assert len(index) == 0 and index.bytes_used == 0


def test_restoring_pays_for_all_but_small_gains() -> None:
    assert restore_pays(600, 700)
    assert not restore_pays(8, 8)  # a few tokens: recomputing them is as cheap
    assert not restore_pays(40, 4000)  # copying 4000 positions to save 40
    assert restore_pays(400, 4000)


def test_bad_matches_and_restores_are_refused_on_construction() -> None:
    for bad in [lambda: TierMatch(3), lambda: TierMatch(5, "k", 4), lambda: RestoreOp(1, "k", 4, 1),
                lambda: RestoreOp(1, "k", 0, 2)]:
        with pytest.raises(ValueError):
            bad()


def test_an_index_that_offers_evicted_entries_names_their_tokens_in_the_kv_ops() -> None:
    index = PrefixIndex(n_seq_ids=4, n_cells=100, offer_evicted=True)
    seq_id, _ = index.allocate()
    index.extend(seq_id, [1, 2, 3, 4, 5, 6], 0.0)
    index.finish(seq_id, 0.0, keep=True)
    assert index.evict(2) == [KvOp(seq_id, 4, save=(1, 2, 3, 4, 5, 6), scope="default", runs=1)]  # trimmed: the whole entry first
    assert index.evict(10) == [KvOp(seq_id, save=(1, 2, 3, 4), scope="default", runs=1)]


def test_admission_restores_from_the_tier_when_it_holds_much_more_than_the_cells() -> None:
    held = list(range(100, 160))  # 60 tokens in the tier
    s = make_scheduler(batch_size=1, n_batch=64,
                       tier=lambda _, tokens: TierMatch(min(len(tokens), 60), "k", 60) if tokens[:1] == [100] else TierMatch(0))
    s.add(make_seq(0, tokens=held + [7, 8]))
    plan = s.schedule(now=0.0)
    seq = plan.admitted[0]
    assert plan.kv_ops == [RestoreOp(seq.seq_id, "k", 60, scratch_id=1)]
    assert (seq.n_past, seq.n_cached) == (60, 60) and s.index.tokens(seq.seq_id) == held
    assert [c.n_tokens for c in plan.chunks] == [2]
    assert 1 in s.index.free_ids  # the scratch id went back to the pool

    s.add(make_seq(0, tokens=[1, 2, 3]))
    assert not any(isinstance(op, RestoreOp) for op in s.schedule(now=0.0).kv_ops)  # nothing held: no restore


def test_a_failed_restore_leaves_the_sequence_computing_its_prompt_from_the_start() -> None:
    s = make_scheduler(batch_size=1, n_batch=64, tier=lambda _, tokens: TierMatch(40, "k", 40))
    seq = make_seq(0, tokens=list(range(1, 50)))
    s.add(seq)
    s.schedule(now=0.0)
    assert s.restore_failed(seq.seq_id) is seq
    assert (seq.n_past, seq.n_cached, s.index.length(seq.seq_id), s.index.cells_used) == (0, 0, 0, 0)
    assert [c.n_tokens for c in s.schedule(now=0.0).chunks] == [49]


def test_a_restore_first_evicts_cached_prefixes_for_the_whole_entry() -> None:
    s = make_scheduler(n_cells=80, batch_size=1, n_batch=64, index=PrefixIndex(n_seq_ids=8, n_cells=80, offer_evicted=True),
                       tier=lambda _, tokens: TierMatch(60, "k", 70) if tokens[0] == 100 else TierMatch(0))
    old = make_seq(0, tokens=list(range(1, 31)))
    s.add(old)
    run_to_end(s, old)  # 30 cells cached: 50 free, the entry needs 70
    s.add(make_seq(0, tokens=list(range(100, 165))))
    ops = s.schedule(now=1.0).kv_ops
    assert ops[0] == KvOp(old.seq_id, 10, save=tuple(range(1, 31)), scope="default", runs=1) and isinstance(ops[1], RestoreOp)
