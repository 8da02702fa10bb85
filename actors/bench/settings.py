"""The settings of one ``llamactor bench`` run, shared by the runner and every workload.

``BenchSettings`` says which model, how many threads and GPU layers, and how thorough a run is
(``quick``: the smoke run's sizes; ``full``: the default run and concurrencies 32 and 64; neither:
the default run), derives the concurrencies, new tokens and repeats from that, and carries the
results dict that workloads may add side results to (the daemon's idle CPU) and each workload's
wall seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class BenchSettings:
    model_path: str
    quick: bool = False
    full: bool = False
    n_threads: int = 2
    n_ctx: int = 8192
    peer_server: str | None = None  # a llama-server binary: adds the "peer" and "streams" workloads
    n_gpu_layers: int = 0  # layers offloaded to a GPU (the CLI's default: Config's), for both servers alike
    frontend_processes: tuple[int, ...] = (1, 2)  # host_cap's split legs: through 1 front-end process, then 2
    results: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # each workload's wall time, by results key

    @property
    def concurrencies(self) -> list[int]:
        if self.quick:
            return [1, 4, 16]
        return [1, 2, 4, 8, 16, 32, 64] if self.full else [1, 2, 4, 8, 16]

    @property
    def max_tokens(self) -> int:
        return 32 if self.quick else 64

    @property
    def repeats(self) -> int:
        return 1 if self.quick else 5
