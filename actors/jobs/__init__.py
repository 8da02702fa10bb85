"""Durable batch jobs: OpenAI's Batch API in the daemon, ``llamactor batch`` and ``run_batch()`` in
process; every line journaled on disk, run at low priority, resumed after a crash, done exactly once."""

from llamactor.jobs.local import BatchResult, run_batch
from llamactor.jobs.runner import LineCounts

__all__ = ["BatchResult", "LineCounts", "run_batch"]
