"""Continuous batching that survives a dry KV pool by preempting, as vLLM does.

When a running request cannot get a block, the latest-arriving running request is
preempted, repeatedly if need be, and no one is admitted in that step. ``mode=recompute``
frees the victim's blocks and keeps its generated tokens; it is re-prefilled later, and the
prefix cache may revive its own blocks. ``mode=swap`` copies its blocks to bounded CPU
swap space and back before it runs again (falling back to recompute when swap space is
full). ``watermark`` keeps that fraction of the pool free at admission, so that running
requests can grow without preempting each other.
"""

from __future__ import annotations

import math

from paged_bench.allocators.base import Allocator
from paged_bench.errors import check, check_number
from paged_bench.request import Request
from paged_bench.schedulers.base import Scheduler


class PreemptiveScheduler(Scheduler):
    name = "preemptive"

    def __init__(self, allocator: Allocator, *, mode: str = "recompute", watermark: float = 0.0, **kwargs) -> None:
        super().__init__(allocator, **kwargs)
        check(mode in ("recompute", "swap"), "scheduler.mode", mode, "recompute or swap")
        check_number("scheduler.watermark", watermark)
        check(watermark < 1, "scheduler.watermark", watermark, "a fraction of the pool in [0, 1)")
        self.preemption_mode = mode
        self.admission_reserve_blocks = math.ceil(watermark * allocator.layout.num_blocks)

    def choose_victim(self, req: Request) -> Request:
        # reversed: among equal arrival times, the most recently admitted one goes
        return max(reversed(self.running), key=lambda r: r.arrival_time)
