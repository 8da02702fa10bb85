"""Batch-invariant mode's packed KV cache (``PackedScheduler``), pure: the scheduler driven through
random workloads against a model of where llama.cpp puts cells, checking that every sequence's
cells stay in position order -- the property flash attention's cell-order sum needs.

``UnifiedCells`` is llama.cpp's unified cache (``llama_kv_cache``, the version we vendor) reduced to
placement: ``seq_rm`` frees cells and moves the search head back to the lowest one freed;
``find_slot`` (not contiguous) starts at the head -- at 0 when more than twice the ubatch's tokens
are free below it -- and takes free cells upwards, wrapping once; after a ubatch the head sits
after its last cell. A step's rows are split into ubatches of ``N_UBATCH`` in order.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from llamactor.base.sampling import SamplingParams
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.scheduling.packed_kv import PackedPrefixIndex, PackedScheduler
from llamactor.scheduling.kv_nodes import KvOp
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Sequence
from llamactor.scheduling.tier_index import RestoreOp, TierMatch

from tests.support.scheduling import make_seq

pytestmark = pytest.mark.pure

N_UBATCH = 32


class UnifiedCells:
    def __init__(self, size: int) -> None:
        self.owners: list[set[int]] = [set() for _ in range(size)]
        self.pos = [-1] * size
        self.head = 0

    def apply(self, ops: list[KvOp]) -> None:
        for op in ops:
            if op.src >= 0:
                for i, owners in enumerate(self.owners):
                    if op.src in owners and self.pos[i] < op.p0:
                        owners.add(op.seq_id)
            else:
                self.seq_rm(op.seq_id, op.p0)

    def seq_rm(self, seq_id: int, p0: int) -> None:
        freed = [i for i, owners in enumerate(self.owners) if seq_id in owners and self.pos[i] >= p0]
        for i in freed:
            self.owners[i].discard(seq_id)
        emptied = [i for i in freed if not self.owners[i]]
        if emptied and emptied[0] < self.head:
            self.head = emptied[0]

    def place(self, rows: list[tuple[int, int]]) -> None:
        """One ubatch of (seq_id, position) rows."""
        size, used = len(self.owners), sum(1 for o in self.owners if o)
        head = 0 if self.head > used + 2 * len(rows) else self.head
        cells: list[int] = []
        tested = 0
        while len(cells) < len(rows):
            if head >= size:
                tested, head = tested + size - head, 0
                continue
            if not self.owners[head]:
                cells.append(head)
            head, tested = head + 1, tested + 1
            assert tested < 2 * size, "no room: the scheduler planned more tokens than free cells"
        for (seq_id, pos), cell in zip(rows, cells):
            self.owners[cell], self.pos[cell] = {seq_id}, pos
        self.head = cells[-1] + 1

    def positions_in_cell_order(self, seq_id: int) -> list[int]:
        return [self.pos[i] for i, owners in enumerate(self.owners) if seq_id in owners]


def new_sequence(rng: random.Random, k: int, now: float) -> Sequence:
    """A request whose prompt often shares a prefix with others (a tiny alphabet, a few stems)."""
    stem = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 9], [7, 7, 8]][rng.randrange(3)]
    prompt = stem[:rng.randint(0, len(stem))] + [rng.randint(1, 9) for _ in range(rng.randint(1, 30))]
    msg = Generate(request_id=f"r{k}", params=SamplingParams(max_tokens=rng.randint(1, 40)), reply=ReplyChannel(),
                   submitted_at=now, text="x", priority=rng.choice([0, 1, 2]))
    return Sequence(request=msg, token_ids=prompt, n_prompt=len(prompt))


def run_workload(seed: int, *, packed: bool) -> tuple[Scheduler, list[str]]:
    """Random arrivals on a small cache; returns the scheduler and every out-of-order sighting."""
    rng = random.Random(seed)
    n_cells, n_parallel = rng.choice([96, 128, 200]), rng.randint(2, 6)
    kind_of_index = PackedPrefixIndex if packed else PrefixIndex
    index = kind_of_index(n_seq_ids=n_parallel + 2 + rng.randint(1, 8), n_cells=n_cells)
    kind = PackedScheduler if packed else Scheduler
    s = kind(n_parallel=n_parallel, n_batch=rng.choice([32, 64]), batch_size=1, batch_timeout_s=0.0,
             max_queue=1000, index=index, keep_finished=rng.random() < 0.8,
             cache_budget_cells=rng.choice([None, None, 40]))
    cells, broken, made, now = UnifiedCells(n_cells), [], 0, 0.0
    for _ in range(400):
        now += 1.0
        if rng.random() < 0.3:
            made += 1
            s.add(new_sequence(rng, made, now))
        plan = s.schedule(now)
        cells.apply(plan.kv_ops)
        for seq in plan.failed:
            cells.apply(s.finish(seq, now))
        tokens, positions, seq_ids, _ = plan.rows()
        rows = list(zip(seq_ids, positions))
        for lo in range(0, len(rows), N_UBATCH):
            cells.place(rows[lo:lo + N_UBATCH])
        for chunk in plan.chunks:
            samples = chunk.samples
            s.computed(chunk, now)
            if samples:
                chunk.seq.token_ids.append(rng.randint(1, 9))
                if chunk.seq.n_generated >= chunk.seq.request.params.max_tokens:
                    cells.apply(s.finish(chunk.seq, now))
        for seq_id in s.index.leaf:
            order = cells.positions_in_cell_order(seq_id)
            assert sorted(order) == list(range(s.index.length(seq_id))), "the index and the cells disagree"
            if order != sorted(order):
                broken.append(f"step at t={now}: seq {seq_id} holds positions in cell order {order}")
    return s, broken


@pytest.mark.parametrize("seed", range(40))
def test_in_a_packed_cache_every_sequence_keeps_its_cells_in_position_order(seed: int) -> None:
    s, broken = run_workload(seed, packed=True)
    assert broken == []
    assert s.n_flushes > 0  # the workloads overflow the cells or the seq_ids: the flushes were exercised


def test_without_packing_the_same_workloads_put_cells_out_of_order() -> None:
    """The model sees the hole the packed cache closes: a freed cell refilled below a sequence's others."""
    assert any(run_workload(seed, packed=False)[1] for seed in range(40))


def test_a_flush_preempts_every_running_sequence_drops_every_entry_and_keeps_the_pinned_one() -> None:
    index = PackedPrefixIndex(n_seq_ids=6, n_cells=40)
    s = PackedScheduler(n_parallel=2, n_batch=64, batch_size=1, batch_timeout_s=0.0, max_queue=10, index=index)
    pinned, _ = index.allocate(None)
    index.extend(pinned, [1, 2, 3], 0.0)
    index.pin(pinned)
    first, second = (new_sequence(random.Random(k), k, 0.0) for k in (1, 2))
    for seq in (first, second):
        s.add(seq)
    for chunk in s.schedule(1.0).chunks:
        s.computed(chunk, 1.0)
        chunk.seq.token_ids.append(5)
    assert s.running == [first, second] or s.running == [second, first]
    plan = s.schedule(2.0)
    plan.chunks, plan.kv_ops = [], []
    s._flush(plan, 2.0)
    assert plan.flushed and set(plan.preempted) == {first, second} and s.running == []
    assert set(index.entries) == {pinned} and index.cells_used == 3
    assert first.seq_id == second.seq_id == -1 and first.n_preempted == second.n_preempted == 1
    assert len(plan.kv_ops) == 2 and all(op.src < 0 and op.p0 == 0 for op in plan.kv_ops)  # whole sequences go


def packed_scheduler(n_cells: int, n_parallel: int, **options: Any) -> PackedScheduler:
    options = {"n_batch": 64, **options}
    return PackedScheduler(n_parallel=n_parallel, batch_size=1, batch_timeout_s=0.0, max_queue=10,
                           index=PackedPrefixIndex(n_seq_ids=n_parallel + 4, n_cells=n_cells), **options)


def decode_step(s: Scheduler, now: float) -> list[Sequence]:
    """Schedule and pretend the step ran, each sampling sequence drawing token 5; returns the plan's preempted."""
    plan = s.schedule(now)
    for chunk in plan.chunks:
        samples = chunk.samples
        s.computed(chunk, now)
        if samples:
            chunk.seq.token_ids.append(5)
    return plan.preempted


def step_until_preempted(s: Scheduler, seqs: list[Sequence], now: float = 0.0) -> tuple[float, list[Sequence]]:
    """Add ``seqs``, then step until a step preempts; returns its time and whom it preempted."""
    for seq in seqs:
        s.add(seq)
    preempted: list[Sequence] = []
    while not preempted:
        now += 1.0
        preempted = decode_step(s, now)
    return now, preempted


def test_running_sequences_that_outgrow_the_cells_are_flushed_and_the_least_urgent_waits_for_one_to_end() -> None:
    s = packed_scheduler(n_cells=24, n_parallel=2)
    urgent, least = make_seq(5, rid="urgent", priority=0), make_seq(5, rid="least", priority=2, at=0.5)
    now, preempted = step_until_preempted(s, [urgent, least], 1.0)  # each grows a cell a step: 24 run short
    assert set(preempted) == {urgent, least} and s.held == [least] and s.n_flushes == 1
    for _ in range(6):
        now += 1.0
        decode_step(s, now)
        assert s.running == [urgent]  # resumed alone; the held one waits while it runs
    s.finish(urgent, now)
    decode_step(s, now + 1.0)
    assert s.held == [] and s.running == [least]


def test_a_flush_holds_back_as_many_of_the_least_urgent_as_the_others_need_to_reach_their_end() -> None:
    s = packed_scheduler(n_cells=64, n_parallel=4)
    seqs = [make_seq(8, rid=f"r{k}", at=k / 10, max_tokens=16, tokens=[k + 1] * 8) for k in range(4)]  # may reach 24
    step_until_preempted(s, seqs)
    assert s.held == [seqs[3], seqs[2]]  # the newest first; two that may reach 48 cells fit in 64
    assert s.n_flushes == 1


def test_answers_without_max_tokens_are_expected_to_add_a_few_hundred_tokens_not_the_whole_context() -> None:
    s = packed_scheduler(n_cells=1200, n_parallel=4, n_batch=1024)  # the prompts in one step: in lockstep
    seqs = [make_seq(250, rid=f"r{k}", at=k / 10, max_tokens=None, tokens=[k + 1] * 250) for k in range(4)]
    step_until_preempted(s, seqs)
    assert s.held == [seqs[3], seqs[2]]  # each holds 300 cells: the other two may reach 2 x 556 of 1200


def test_a_lone_sequence_that_outgrows_the_cells_fails_rather_than_flushing_itself_forever() -> None:
    s = packed_scheduler(n_cells=8, n_parallel=2)
    lone = make_seq(5, rid="lone")
    s.add(lone)
    now, failed = 0.0, []
    while not failed:
        now += 1.0
        plan = s.schedule(now)
        failed = plan.failed
        for chunk in plan.chunks:
            s.computed(chunk, now)
            lone.token_ids.append(5)
    assert failed == [lone] and s.n_flushes == 0


def test_no_seq_id_to_spare_flushes_the_entries_before_the_next_admission() -> None:
    s = packed_scheduler(n_cells=100, n_parallel=1)  # 5 seq_ids: one runs, four hold entries
    for k in range(5):
        seq = make_seq(3, rid=f"r{k}", tokens=[k + 1, 2, 3])
        s.add(seq)
        decode_step(s, float(k))
        s.finish(seq, float(k))
    assert len(s.index.entries) == 5 and s.n_flushes == 0 and s.index.cells_used == 15
    s.add(make_seq(3, rid="sixth", tokens=[9, 9, 9]))
    plan = s.schedule(9.0)
    assert plan.flushed and plan.admitted == [] and s.index.entries == {} and s.index.cells_used == 0
    assert s.schedule(10.0).admitted[0].request_id == "sixth"


def test_tier_entries_longer_than_the_sliding_window_are_recomputed_rather_than_restored() -> None:
    def tier(scope: str, tokens: list[int]) -> TierMatch:
        return TierMatch(len(tokens) - 1, "k", len(tokens) - 1)
    for n_prompt, window, restored in ((600, 512, False), (400, 512, True), (600, 0, True)):
        s = packed_scheduler(n_cells=2000, n_parallel=1, tier=tier, sliding_window=window)
        s.add(make_seq(n_prompt))
        assert any(isinstance(op, RestoreOp) for op in s.schedule(1.0).kv_ops) == restored, (n_prompt, window)


def test_entries_outgrowing_their_cell_budget_are_flushed_at_the_next_step_not_trimmed() -> None:
    s = packed_scheduler(n_cells=100, n_parallel=2, cache_budget_cells=8)
    for k in range(3):
        seq = make_seq(3, rid=f"r{k}", tokens=[k + 1, 2, 3])
        s.add(seq)
        decode_step(s, float(k))
        s.finish(seq, float(k))
        assert s.index.cells_used == 3 * (k + 1)  # kept whole: nothing trimmed below held cells
    assert s.schedule(5.0).flushed and s.index.cells_used == 0
