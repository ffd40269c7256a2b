"""Least outstanding requests (join the shortest queue): the replica with the fewest requests
in flight, counting those routed to it that it has not picked up yet."""

from __future__ import annotations

from collections.abc import Sequence

from paged_bench.core.request import Request
from paged_bench.routers.base import ReplicaView, Router, least_loaded


class LeastOutstandingRouter(Router):
    name = "least_outstanding"

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        return least_loaded(replicas)
