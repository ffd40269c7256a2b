"""When each request of a workload is sent: at its arrival time (open loop), or also no more
than N in flight (closed loop, ``workload.max_concurrency``).

The engine's run loop and the HTTP load generator both consume a feed the same way:

    due(now)              the requests to send now (each once)
    next_time()           when the next one falls due (None: only when one in flight finishes,
                          or never if none is in flight)
    finished(reqs, now)   these requests ended: their slots free up
    pending()             the requests never sent (to report when a run stops early)

A closed loop is what ``vllm bench serve --max-concurrency N`` does (guidellm's ``poisson``
and ``constant`` profiles with ``--max-concurrency``): a request waits for its arrival time *and*
a free slot. vLLM's client starts a
request's clock when it takes a slot (after its semaphore), so a request the cap held back has
``arrival_time`` moved to when a slot opened for it; one that arrived while a slot was free keeps
its arrival time, even if it is sent later (the engine takes requests in only between steps, as
it does in an open loop): a cap that never binds changes nothing. With every arrival at 0
(``workload.rate=inf``) that is N users each sending the next request as soon as the last one
ends: guidellm's ``concurrent`` profile, which has no arrival times.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from paged_bench.core.request import Request


class OpenLoop:
    """Each request at its arrival time, whatever is in flight."""

    def __init__(self, requests: Iterable[Request]) -> None:
        self.requests = sorted(requests, key=lambda r: r.arrival_time)
        self._next = 0  # index of the first request not yet sent

    def due(self, now: float) -> list[Request]:
        reqs, start = self.requests, self._next
        end, limit = start, self._limit()
        while end < limit and reqs[end].arrival_time <= now:
            end += 1
        self._next = end
        return reqs[start:end]

    def _limit(self) -> int:
        """One past the last request that may be sent now (when due)."""
        return len(self.requests)

    def next_time(self) -> float | None:
        return self.requests[self._next].arrival_time if self._next < len(self.requests) else None

    def finished(self, reqs: list[Request], now: float) -> None:
        pass

    def pending(self) -> list[Request]:
        return self.requests[self._next :]


class ClosedLoop(OpenLoop):
    """Each request at its arrival time once fewer than ``max_concurrency`` are in flight."""

    def __init__(self, requests: Iterable[Request], max_concurrency: int) -> None:
        super().__init__(requests)
        self.max_concurrency = max_concurrency
        self.in_flight = 0
        # when a slot last opened in a full loop: a request sent later that arrived before then
        # was held by the cap (the loop was full when it arrived, or filled before it was sent)
        self.slot_opened = -math.inf

    def due(self, now: float) -> list[Request]:
        sent = super().due(now)
        self.in_flight += len(sent)
        for req in sent:
            if req.arrival_time < self.slot_opened:  # held back by the cap: its clock starts with its slot
                req.arrival_time = self.slot_opened
        return sent

    def _limit(self) -> int:
        return min(len(self.requests), self._next + self.max_concurrency - self.in_flight)

    def next_time(self) -> float | None:
        if self.in_flight >= self.max_concurrency:
            return None
        return super().next_time()

    def finished(self, reqs: list[Request], now: float) -> None:
        if reqs and self.in_flight >= self.max_concurrency:
            self.slot_opened = now
        self.in_flight -= len(reqs)


def feed(requests: Iterable[Request], max_concurrency: int | None = None) -> OpenLoop:
    """The feed for a workload's requests: closed loop when ``max_concurrency`` is set."""
    return OpenLoop(requests) if max_concurrency is None else ClosedLoop(requests, max_concurrency)
