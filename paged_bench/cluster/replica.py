"""One replica of a simulated cluster: an engine, the requests routed to it that it has not
picked up yet, and the read-only view a router gets of it.

A replica picks up what was routed to it at its next step boundary, as a serving engine's
loop does between steps; until then those requests count as in flight for the router.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from paged_bench.core.engine import Engine
from paged_bench.core.request import Request
from paged_bench.errors import EngineError
from paged_bench.routers.base import ReplicaView

Role = Literal["colocated", "prefill", "decode"]


@dataclass(eq=False)
class Replica:
    index: int  # its place in the cluster (prefill replicas first)
    role: Role
    engine: Engine
    inbox: list[Request] = field(default_factory=list)  # routed here, not picked up yet
    handoffs: deque[Request] = field(default_factory=deque)  # prefilled elsewhere, K/V arrived, not admitted yet
    num_incoming: int = 0  # prefilled elsewhere, K/V still on the wire
    num_finishing: int = 0  # requests its current step finishes (they count until it ends)

    @property
    def free_at(self) -> float:
        """When its current (or last) step ends."""
        return self.engine.clock.now()

    def has_work(self) -> bool:
        return bool(self.inbox or self.handoffs or self.engine.has_unfinished())

    def pick_up(self) -> list[Request]:
        """Take in what arrived while it was busy; called at a step boundary. Returns the
        requests the scheduler refused outright (finished as rejected)."""
        for req in self.inbox:
            self.engine.add_request(req)
        rejected = [req for req in self.inbox if req.is_finished]
        self.inbox.clear()
        sched = self.engine.scheduler
        while self.handoffs and sched.add_prefilled(self.handoffs[0], self.engine.clock.now()):
            self.handoffs.popleft()
        if self.handoffs and not sched.has_unfinished():
            req = self.handoffs[0]
            raise EngineError(
                f"replica {self.index} cannot take request {req.request_id}'s {req.num_prompt_tokens} transferred "
                f"prompt tokens even with nothing running; use a larger num_blocks"
            )
        return rejected


class View(ReplicaView):
    """A replica as its router sees it at the cluster's time ``now()``. A replica is stepped
    whole when its step starts, so mid-step it already looks as it will at the step's end;
    the requests that step finishes are counted in flight until then."""

    __slots__ = ("index", "_replica", "_now")

    def __init__(self, index: int, replica: Replica, now: Callable[[], float]) -> None:
        self.index = index
        self._replica = replica
        self._now = now

    @property
    def num_in_flight(self) -> int:
        r = self._replica
        sched = r.engine.scheduler
        finishing = r.num_finishing if self._now() < r.free_at else 0
        return len(r.inbox) + len(r.handoffs) + r.num_incoming + len(sched.waiting) + len(sched.running) + finishing

    @property
    def num_free_blocks(self) -> int:
        return self._replica.engine.allocator.num_free_blocks

    @property
    def num_blocks(self) -> int:
        return self._replica.engine.allocator.layout.num_blocks

    def cached_prefix_tokens(self, req: Request) -> int:
        return self._replica.engine.allocator.cached_prefix_tokens(req)
