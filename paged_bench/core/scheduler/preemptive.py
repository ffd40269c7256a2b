"""Continuous batching that survives a dry KV pool by preempting, as vLLM does.

When a running request cannot get a block, a victim is preempted, repeatedly if need be,
and no one is admitted in that step. ``victim=last_admitted`` (the default, vLLM v1's: the
running list's tail) takes the request admitted most recently; ``victim=latest_arrival``
takes the one that arrived last (among equal arrivals, the later admitted). ``mode=recompute``
frees the victim's blocks and keeps its generated tokens; it is re-prefilled later, and the
prefix cache may revive its own blocks. ``mode=swap`` copies its blocks to bounded CPU swap
space and back before it runs again (falling back to recompute when swap space is full).
``watermark`` keeps that fraction of the pool free (rounded down, as vLLM v1's admission
watermark) at admission and at swap-in, so that running requests can grow without preempting
each other; a request admitted into an empty engine ignores it. vLLM v1 recomputes only: swap
is vLLM v0's.
"""

from __future__ import annotations

from typing import Literal

from mypy_extensions import mypyc_attr

from paged_bench.core.kv.base import Allocator
from paged_bench.core.request import Request
from paged_bench.core.scheduler.base import Scheduler

VICTIMS = ("last_admitted", "latest_arrival")


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled with the core (native calls); plugins subclass it
class PreemptiveScheduler(Scheduler):
    name = "preemptive"

    def __init__(
        self,
        allocator: Allocator,
        *,  # checked before they get here, where the config is read (paged_bench.run.plugin_options)
        max_model_len: int,
        max_batch: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool = True,
        prefill_first: bool = False,
        num_scheduler_steps: int = 1,
        long_prefill_token_threshold: int = 0,
        mode: Literal["recompute", "swap"] = "recompute",
        watermark: float = 0.0,
        victim: Literal["last_admitted", "latest_arrival"] = "last_admitted",
        eos_token_id: int | None = None,
        stop_token_ids: tuple[int, ...] = (),
    ) -> None:
        super().__init__(allocator, max_model_len=max_model_len, max_batch=max_batch,
                         max_num_batched_tokens=max_num_batched_tokens, chunked_prefill=chunked_prefill,
                         prefill_first=prefill_first, num_scheduler_steps=num_scheduler_steps,
                         long_prefill_token_threshold=long_prefill_token_threshold,
                         eos_token_id=eos_token_id, stop_token_ids=stop_token_ids)  # fmt: skip
        self.preemption_mode = mode
        self.victim = victim
        self.admission_reserve_blocks = int(watermark * allocator.layout.num_blocks)

    def choose_victim(self, req: Request) -> Request:
        if self.victim == "last_admitted":
            return self.running[-1]
        # reversed: among equal arrival times, the most recently admitted one goes
        return max(reversed(self.running), key=lambda r: r.arrival_time)
