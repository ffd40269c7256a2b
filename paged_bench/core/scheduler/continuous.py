"""Continuous (iteration-level) batching, as in Orca and vLLM.

The batch is re-decided at every step: running requests go first, then waiting ones are
admitted first-come first-served while ``max_batch`` and the token budget allow, so a
finished sequence's seat is taken at the very next step. It never preempts: when a running
sequence cannot get its next KV block the run stops with a clear error (see
``preemptive`` for the policy that survives that).
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from paged_bench.core.scheduler.base import Scheduler


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled with the core (native calls); plugins subclass it
class ContinuousScheduler(Scheduler):
    name = "continuous"
