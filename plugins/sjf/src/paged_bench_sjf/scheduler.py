"""Shortest job first: admit the waiting request with the shortest predicted output.

Continuous batching whose only change is the ``pick_waiting`` hook of paged_bench's scheduler
base: instead of first come, first served, the waiting request predicted to generate the
fewest tokens is admitted next, so short requests stop queueing behind long ones (lower
median TTFT and E2EL; the long ones pay).

The prediction is the request's ``max_tokens``, optionally blurred by a log-normal error
(``noise``) to stand in for a learned length predictor. ``max_wait_s`` bounds starvation: a
request that has waited longer than that is admitted first. Preempted or swapped requests
keep the front of the queue, as in the base policy, since they already hold progress.
"""

from __future__ import annotations

import math

import numpy as np

from paged_bench.core.kv.base import Allocator
from paged_bench.core.request import Request, RequestStatus
from paged_bench.core.scheduler.base import Scheduler
from paged_bench.errors import check, check_number

_RESUMING = (RequestStatus.PREEMPTED, RequestStatus.SWAPPED)


class SJFScheduler(Scheduler):
    name = "sjf"

    def __init__(
        self,
        allocator: Allocator,
        *,
        noise: float = 0.0,
        max_wait_s: float | None = None,
        seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(allocator, **kwargs)
        self.noise = check_number("scheduler.noise", noise)
        check(max_wait_s is None or (isinstance(max_wait_s, (int, float)) and max_wait_s > 0),
              "scheduler.max_wait_s", max_wait_s, "a number of seconds > 0, or null")  # fmt: skip
        self.max_wait_s = max_wait_s
        self._rng = np.random.default_rng(seed)
        self._predicted: dict[Request, float] = {}
        self._now = 0.0

    def predicted_output(self, req: Request) -> float:
        """The predicted number of output tokens, drawn once per request."""
        got = self._predicted.get(req)
        if got is None:
            error = math.exp(self._rng.normal(0.0, self.noise)) if self.noise else 1.0
            got = self._predicted[req] = req.max_tokens * error
        return got

    def schedule(self, now: float):
        self._now = now  # pick_waiting has no clock of its own
        return super().schedule(now)

    def pick_waiting(self) -> Request:
        first = self.waiting[0]
        if first.status in _RESUMING:
            return first
        if self.max_wait_s is not None and self._now - first.arrival_time > self.max_wait_s:
            return min(self.waiting, key=lambda r: r.arrival_time)
        return min(self.waiting, key=lambda r: (self.predicted_output(r), r.arrival_time))

    def finish_request(self, req, reason, now, error=None) -> None:
        self._predicted.pop(req, None)
        super().finish_request(req, reason, now, error)

    def update(self, plan, output, now):
        finished = super().update(plan, output, now)
        for req in finished:
            self._predicted.pop(req, None)
        return finished
