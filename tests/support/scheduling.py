"""Builders for the pure scheduling tests (test_scheduler.py, test_policy.py): no threads, no llama.cpp."""

from __future__ import annotations

from llamactor.base.sampling import SamplingParams
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.scheduling.kv_nodes import KvOp
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Sequence


def make_seq(n_prompt: int, *, at: float = 0.0, rid: str = "r", tokens: list[int] | None = None,
             priority: int = 1, lora: tuple[tuple[str, float], ...] = (), max_tokens: int | None = 256) -> Sequence:
    msg = Generate(request_id=rid, params=SamplingParams(max_tokens=max_tokens), reply=ReplyChannel(), submitted_at=at,
                   text="x", priority=priority, lora=lora)
    ids = tokens if tokens is not None else list(range(1, n_prompt + 1))
    return Sequence(request=msg, token_ids=ids, n_prompt=len(ids))


def make_scheduler(n_cells: int = 1000, **overrides: object) -> Scheduler:
    options: dict = dict(n_parallel=2, n_batch=16, batch_size=2, batch_timeout_s=0.02, max_queue=4)
    options.update(overrides)
    options.setdefault("index", PrefixIndex(n_seq_ids=8, n_cells=n_cells))
    return Scheduler(**options)


def run_to_end(s: Scheduler, seq: Sequence, now: float = 0.0) -> list[KvOp]:
    """Pretend every planned chunk of ``seq`` was decoded, then finish it."""
    while seq.n_unprocessed > 0:
        for chunk in s.schedule(now).chunks:
            s.computed(chunk, now)
    return s.finish(seq, now)
