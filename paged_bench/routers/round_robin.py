"""Round robin: replica 0, 1, ..., N-1, 0, ... whatever their state (the baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from paged_bench.core.request import Request
from paged_bench.routers.base import ReplicaView, Router


class RoundRobinRouter(Router):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        index = self._next % len(replicas)
        self._next = index + 1
        return index
