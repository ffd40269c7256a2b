"""Static batching, the pre-Orca way: seat a batch, run it until every member finishes.

When the engine is idle, up to ``max_batch`` waiting requests are seated; nobody else is
admitted until the whole batch is done, so short requests wait for the batch's longest
one and newcomers wait for all of them. Like ``continuous`` it never preempts.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from paged_bench.core.scheduler.base import PlanDraft, Scheduler


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled with the core (native calls); plugins subclass it
class StaticScheduler(Scheduler):
    name = "static"

    def may_admit(self, plan: PlanDraft) -> bool:
        return not self.running
