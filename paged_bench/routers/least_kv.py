"""Least KV: the replica with the largest share of its KV blocks free (the most free blocks,
replicas' pools being equal; fewest requests in flight on ties).

Free blocks lag the queue (a request holds no blocks until it is admitted), so under a burst
this router can pile requests onto one replica; that is the difference from
``least_outstanding`` it exists to show."""

from __future__ import annotations

from collections.abc import Sequence

from paged_bench.core.request import Request
from paged_bench.routers.base import ReplicaView, Router


class LeastKVRouter(Router):
    name = "least_kv"

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        return min(replicas, key=lambda r: (-r.num_free_blocks / r.num_blocks, r.num_in_flight, r.index)).index
