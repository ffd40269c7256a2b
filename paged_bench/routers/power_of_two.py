"""Power of two choices (Mitzenmacher): sample two distinct replicas at random, send the
request to the one with fewer requests in flight. Nearly as balanced as asking every
replica, at the cost of two probes; seeded, so a run is reproducible."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from paged_bench.errors import check_int
from paged_bench.request import Request
from paged_bench.routers.base import ReplicaView, Router, least_loaded


class PowerOfTwoRouter(Router):
    name = "power_of_two"

    def __init__(self, *, seed: int = 0) -> None:
        self._rng = np.random.default_rng(check_int("router.seed", seed, 0))

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        if len(replicas) == 1:
            return 0
        a, b = self._rng.choice(len(replicas), size=2, replace=False)
        return least_loaded([replicas[a], replicas[b]])
