"""The router protocol: a cluster's front door picks a replica for each request.

A router is one hook, ``route(request, replicas) -> index``, called when the request arrives
(and, in a disaggregated cluster, again when its prefill is done, over the decode replicas).
It sees each replica through a small read-only ``ReplicaView`` of that moment: requests in
flight, free KV blocks, and how much of the request's prompt the replica holds cached. A
router keeps whatever state it likes between calls (a counter, a random stream); one router
object serves one pool of replicas.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from paged_bench.core.request import Request


class ReplicaView(ABC):
    """What a router may know about one replica, read at the moment of the decision."""

    index: int  # position in the list handed to ``route``

    @property
    @abstractmethod
    def num_in_flight(self) -> int:
        """Requests sent here and not finished: queued at the door, waiting, running, in transfer."""

    @property
    @abstractmethod
    def num_free_blocks(self) -> int:
        """KV blocks the replica could hand out now (cached blocks nobody holds count as free)."""

    @property
    @abstractmethod
    def num_blocks(self) -> int:
        """The replica's KV pool size in blocks."""

    @abstractmethod
    def cached_prefix_tokens(self, req: Request) -> int:
        """Leading tokens of ``req``'s prompt this replica's prefix cache holds now."""


class Router(ABC):
    name: ClassVar[str] = ""

    @abstractmethod
    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        """The index (into ``replicas``) of the replica that takes ``req``."""


def least_loaded(replicas: Sequence[ReplicaView]) -> int:
    """The replica with the fewest requests in flight (the lowest index on ties)."""
    return min(replicas, key=lambda r: (r.num_in_flight, r.index)).index
