"""Poisson arrivals: exponential gaps with mean ``1 / rate`` (memoryless, the usual baseline)."""

from __future__ import annotations

import numpy as np

from paged_bench.workloads.base import SyntheticWorkload


class PoissonWorkload(SyntheticWorkload):
    name = "poisson"
    burstiness = 1.0  # vLLM's default --burstiness: exponential gaps

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate, size=n)
