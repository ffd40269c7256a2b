"""Bursty arrivals: gamma-distributed gaps with shape ``burstiness``, as vLLM's benchmark client.

The mean gap stays ``1 / rate``; ``burstiness`` < 1 clusters requests into bursts separated
by lulls, 1.0 is Poisson, and > 1 spaces them more evenly.
"""

from __future__ import annotations

import numpy as np

from paged_bench.errors import check_number
from paged_bench.workloads.base import SyntheticWorkload


class BurstyWorkload(SyntheticWorkload):
    name = "bursty"

    def __init__(self, *, burstiness: float = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        self.burstiness = check_number("workload.burstiness", burstiness, 0, strict=True)

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), size=n)
