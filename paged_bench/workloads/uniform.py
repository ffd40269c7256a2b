"""Evenly spaced arrivals, ``1 / rate`` apart: no arrival variance at all (a control)."""

from __future__ import annotations

import math

import numpy as np

from paged_bench.workloads.base import SyntheticWorkload


class UniformWorkload(SyntheticWorkload):
    name = "uniform"
    burstiness = math.inf  # vLLM's --burstiness inf: every gap 1 / rate

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, 1.0 / self.rate)
