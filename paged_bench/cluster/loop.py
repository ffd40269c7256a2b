"""The cluster's discrete-event loop: every replica on one virtual timeline.

Three kinds of event, taken in time order (on a tie: arrivals, then hand-overs, then steps):

- an arrival: the router picks a replica from their state at that moment, and the request
  waits at that replica's door until its next step boundary;
- a hand-over (disaggregated only): a prefill finished (pick a decode replica, put the K/V
  on the link), or a transfer arrived (the decode replica may admit it);
- a step: the replica that is free earliest and has work runs one engine step, which moves
  its own clock (its position on the timeline) to the step's end. (Replicas free by now go
  in index order. Replicas with work wait in two heaps, busy by the time they are free and
  free by index, so that finding the next costs O(log replicas), not a scan of them all:
  at 256 replicas the scan was half of a run.)

Each replica is an ordinary ``Engine`` driven through ``add_request`` / ``step`` /
``has_unfinished``; so one replica behind the loop runs exactly as ``Engine.run``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from paged_bench.cluster.handoff import Transfer, prefill_copy, take_prefill
from paged_bench.cluster.link import Link, LinkQueue
from paged_bench.cluster.replica import Replica, View
from paged_bench.core.clock import HORIZON_S, past_horizon
from paged_bench.core.engine import EngineResult
from paged_bench.core.request import FinishReason, Request
from paged_bench.errors import EngineError, crash_message
from paged_bench.routers.base import Router

log = logging.getLogger(__name__)

INF = float("inf")


@dataclass
class ClusterRun:
    """What a cluster run leaves: per replica its engine's result, and the transfers."""

    requests: list[Request]  # the workload's requests, as the client sees them
    replicas: list[Replica]
    results: list[EngineResult]  # one per replica, over the requests it ran
    placement: dict[Request, int]  # request -> the replica that produced its last token
    prefill_placement: dict[Request, int] = field(default_factory=dict)  # disaggregated: where it prefilled
    transfers: list[Transfer] = field(default_factory=list)
    error: str | None = None
    interrupted: bool = False


class Cluster:
    def __init__(
        self,
        replicas: Sequence[Replica],
        router: Router,
        decode_router: Router | None = None,
        link: Link | None = None,
        kv_bytes_per_token: int = 0,
    ) -> None:
        self.replicas = list(replicas)
        self.now = 0.0
        self.entry = [r for r in self.replicas if r.role != "decode"]  # arrivals go here
        self.decode = [r for r in self.replicas if r.role == "decode"]
        clock: Callable[[], float] = lambda: self.now
        self.entry_views = [View(i, r, clock) for i, r in enumerate(self.entry)]
        self.decode_views = [View(i, r, clock) for i, r in enumerate(self.decode)]
        self.router, self.decode_router = router, decode_router
        # a tensor-parallel replica's ranks each send their share of the K/V over their own link
        lanes = {r.index: r.engine.backend.num_devices for r in self.entry}
        self.links = {i: LinkQueue(link, n) for i, n in lanes.items()} if link is not None else {}
        self.kv_bytes_per_token = kv_bytes_per_token
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._origin: dict[Request, Request] = {}  # prefill copy -> the request it stands for
        self._ran: list[list[Request]] = [[] for _ in self.replicas]  # requests each replica ran
        self._on_step: Callable[[float, list[Request]], None] | None = None
        self._out = ClusterRun([], self.replicas, [], {})  # what run() fills in
        self._busy: list[tuple[float, int]] = []  # (free_at, index) of replicas with work, stepping now
        self._free: list[int] = []  # indices of replicas with work, free by now
        self._queued = [False] * len(self.replicas)  # in one of the two

    # -- the loop ------------------------------------------------------------------------

    def run(
        self, requests: list[Request], on_step: Callable[[float, list[Request]], None] | None = None
    ) -> ClusterRun:
        """Replay ``requests`` at their arrival times until every one has finished.

        ``on_step(now, finished)`` is called after every replica step with the workload's
        requests it finished."""
        reqs = sorted(requests, key=lambda r: r.arrival_time)
        self._on_step = on_step
        self._out = ClusterRun(reqs, self.replicas, [], {})
        for replica in self.replicas:
            replica.engine.clock.start()
        self._busy, self._free, self._queued = [], [], [False] * len(self.replicas)
        for replica in self.replicas:
            if replica.has_work():
                self._queue(replica)
        error, interrupted, next_arrival = None, False, 0
        try:
            while True:
                t_arrival = reqs[next_arrival].arrival_time if next_arrival < len(reqs) else INF
                t_event = self._events[0][0] if self._events else INF
                t_step = self._next_step_time()
                if t_arrival <= t_event and t_arrival <= t_step:
                    if t_arrival == INF:
                        break
                    self.now = t_arrival
                    self._route(reqs[next_arrival])
                    next_arrival += 1
                elif t_event <= t_step:
                    self.now, _, action = heapq.heappop(self._events)
                    action()
                else:
                    self.now = t_step
                    self._step(self._take_next())
        except EngineError as e:
            error = str(e)
        except KeyboardInterrupt:
            error, interrupted = "interrupted", True
        except Exception as e:  # a plugin's bug (a router, a replica's policy) or ours: keep what ran
            error = crash_message(e)
            log.exception("the cluster run stopped: %s", error)
        if error is not None:
            self._stop(reqs, error, interrupted)
        out = self._out
        out.error, out.interrupted = error, interrupted
        out.results = [r.engine.result(ran, error, interrupted) for r, ran in zip(self.replicas, self._ran)]
        return out

    def _next_step_time(self) -> float:
        """When the next replica steps: the one with work that is free earliest (the first by
        index of those free by now, which this moves from the busy heap to the free one)."""
        busy, free = self._busy, self._free
        while busy and busy[0][0] <= self.now:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            return self.now
        return busy[0][0] if busy else INF

    def _take_next(self) -> Replica:
        """Take the replica that steps now out of the heaps (the clock is at its step)."""
        self._next_step_time()
        index = heapq.heappop(self._free)
        self._queued[index] = False
        return self.replicas[index]

    def _queue(self, replica: Replica) -> None:
        """Put a replica that has work in line for a step, unless it is already."""
        if not self._queued[replica.index]:
            self._queued[replica.index] = True
            heapq.heappush(self._busy, (replica.free_at, replica.index))

    def _at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), action))

    def _route(self, req: Request) -> None:
        replica = self.entry[_routed(self.router, req, self.entry_views)]
        if replica.role == "prefill":
            copy = prefill_copy(req)
            self._origin[copy] = req
            self._out.prefill_placement[req] = replica.index
            replica.inbox.append(copy)
            self._ran[replica.index].append(copy)
        else:
            self._out.placement[req] = replica.index
            replica.inbox.append(req)
            self._ran[replica.index].append(req)
        self._queue(replica)

    def _step(self, replica: Replica) -> None:
        engine = replica.engine
        engine.clock.wait_until(self.now)
        done = replica.pick_up()
        finished = engine.step() if engine.has_unfinished() else []
        replica.num_finishing = len(finished)
        if replica.has_work():
            self._queue(replica)
        if replica.role == "prefill":
            for copy in done + finished:
                self._at(copy.finish_time, lambda c=copy, r=replica: self._prefilled(c, r))
        elif self._on_step is not None:
            self._on_step(engine.clock.now(), finished)

    # -- disaggregation ------------------------------------------------------------------

    def _prefilled(self, copy: Request, source: Replica) -> None:
        req = self._origin.pop(copy)
        sched = source.engine.scheduler
        if not take_prefill(req, copy, sched.max_model_len, sched.end_token_ids):
            self._out.placement[req] = source.index
            if self._on_step is not None:
                self._on_step(self.now, [req])
            return
        target = self.decode[_routed(self.decode_router, req, self.decode_views)]
        target.num_incoming += 1
        num_bytes = self.kv_bytes_per_token * req.num_prompt_tokens
        done = self.links[source.index].send(self.now, num_bytes)
        if not done < HORIZON_S:  # also inf: the transfer would never arrive
            link = self.links[source.index].link
            raise past_horizon(done, f"a K/V transfer of {num_bytes:,} bytes over {link.name} at "
                                     f"{link.bandwidth / 1e9:.3g} GB/s and {link.latency * 1e6:.3g} us: raise "
                                     "cluster.link_bandwidth_gbs or lower cluster.link_latency_us")  # fmt: skip
        transfer = Transfer(req, source.index, target.index, num_bytes, self.now, done)
        self._out.transfers.append(transfer)
        self._out.placement[req] = target.index
        self._at(done, lambda: self._arrived(transfer))

    def _arrived(self, transfer: Transfer) -> None:
        target = self.replicas[transfer.target]
        target.num_incoming -= 1
        target.handoffs.append(transfer.request)
        self._ran[target.index].append(transfer.request)
        self._queue(target)

    # -- stopping early ------------------------------------------------------------------

    def _stop(self, reqs: list[Request], error: str, interrupted: bool) -> None:
        """End everything unfinished and free every block, as ``Engine.run`` does."""
        reason = FinishReason.ABORT if interrupted else FinishReason.ERROR
        now = max([self.now] + [r.free_at for r in self.replicas])
        for replica, ran in zip(self.replicas, self._ran):
            replica.engine.scheduler.abort_all(reason, now, error, submitted=ran, unsent=replica.inbox)
        out = self._out
        for req in reqs:  # no replica holds it: prefilled, its K/V still on the wire, or never routed
            if not req.is_finished:
                placed = req in out.placement or req in out.prefill_placement
                req.finish(reason, now, error if placed else f"not submitted: {error}")


def _routed(router: Router, req: Request, views: Sequence[View]) -> int:
    """The router's choice for ``req``, checked: a negative index would pick from the end."""
    choice = router.route(req, views)
    try:
        index = operator.index(choice)  # an int, numpy's included
    except TypeError:
        index = -1
    if not 0 <= index < len(views):
        raise EngineError(f"router {router.name!r}: route() returned {choice!r} for request {req.request_id}, "
                          f"not the index of one of its {len(views)} replicas (0 to {len(views) - 1})")  # fmt: skip
    return index
