"""The engine: the step loop that ties a workload, a scheduler, an allocator and a backend.

Each step: admit the requests that have arrived by now, let the scheduler plan, let the
backend execute, let the scheduler record the sampled tokens, note the step, advance the
clock; when nothing is left to run, idle to the next arrival. The engine knows the four
plugin protocols and nothing of Hydra, MLflow or HTTP.

If the run must stop (``EngineError``, e.g. the pool ran dry under a non-preemptive policy)
or is interrupted, every unfinished request is ended with its reason and its blocks are
freed, so the results gathered so far are complete and the pool is whole.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, SupportsIndex

from paged_bench.core.arrivals import feed
from paged_bench.core.clock import STEP_TIMERS, VirtualClock, WallClock
from paged_bench.core.kv.base import Allocator, KVLayout
from paged_bench.core.plan import StepOutput, StepPlan
from paged_bench.core.request import FinishReason, Request
from paged_bench.core.scheduler.base import Scheduler
from paged_bench.core.step_records import STEP_COLUMNS, StepRecords
from paged_bench.errors import EngineError, counted, crash_message

__all__ = ["STEP_COLUMNS", "Engine", "EngineResult", "StepRecords"]

log = logging.getLogger(__name__)


class Executor(Protocol):
    """What the engine asks of a backend (the plugin kind's base class is
    ``paged_bench.backends.base.Backend``): run a plan, on a clock of its kind."""

    @property
    def name(self) -> str: ...
    @property
    def clock(self) -> str: ...  # "virtual": it prices steps; "wall": the engine times them
    @property
    def reads_token_ids(self) -> bool: ...  # False: plans carry no token ids
    @property
    def kv_bytes_per_token(self) -> int | None: ...

    def execute(self, plan: StepPlan) -> StepOutput: ...


@dataclass
class EngineResult:
    requests: list[Request]
    steps: StepRecords  # one row per step, read by column name
    duration: float  # seconds from the start to the end of the last step
    layout: KVLayout
    kv_bytes_per_token: int | None
    num_preemptions: int
    recomputed_tokens: int
    swapped_blocks: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    preempted_prefix_query_tokens: int = 0
    preempted_prefix_hit_tokens: int = 0
    error: str | None = None  # why the run stopped early, if it did
    interrupted: bool = False
    leaks: list[str] = field(default_factory=list)


class Engine:
    def __init__(
        self,
        scheduler: Scheduler,
        backend: Executor,
        clock: VirtualClock | WallClock,
        max_step_records: int | None = None,
        step_timer: str = "wall",
    ) -> None:
        self.scheduler = scheduler
        self.allocator = scheduler.allocator
        self.backend = backend
        scheduler.plan_token_ids = backend.reads_token_ids
        self.clock = clock
        # a long-lived server keeps only the latest step records, so its memory stays flat
        self.steps = StepRecords(max_step_records)
        self.num_steps = 0
        # a real model on virtual time (clock=virtual): a step lasts what scheduling and computing
        # it took, unless the backend priced it itself, and the clock jumps over idle gaps (a
        # model's own duration is 0: the wall clock times it)
        self._timed = backend.clock == "wall" and clock.kind == "virtual"
        self._timer = STEP_TIMERS[step_timer]  # what times it (core.clock: wall or thread CPU time)
        # seconds per streamed output that an API server in the engine's own process spends after
        # each step, before the next one can start (vLLM 0.5.x; run/frontend.py ``stream_ms``)
        self.stream_s = 0.0

    def add_request(self, req: Request) -> None:
        self.scheduler.add_request(req, self.clock.now())

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[Request]:
        """Run one step; returns the requests that finished in it."""
        sched, allocator = self.scheduler, self.allocator
        start = self.clock.now()
        began = self._timer() if self._timed else 0.0
        plan = sched.schedule(start)
        if plan.is_empty:
            if plan.num_preempted:  # everyone was preempted: they are readmitted next step
                return []
            raise EngineError(f"scheduler {sched.name!r} planned an empty step with {len(sched.running)} running "
                              f"and {len(sched.waiting)} waiting requests")  # fmt: skip
        # KV as the step holds it: after scheduling, before finished requests are freed
        live, reserved, free_blocks = allocator.live_slots, allocator.reserved_slots, allocator.num_free_blocks
        output = self._execute(plan)
        if self._timed and not output.duration:
            output.duration = self._timer() - began
        end = self.clock.advance(start, output.duration + self._streaming(plan))
        finished = self._update(plan, output, end)
        self.steps.record(
            step=self.num_steps,
            time=end,
            duration=end - start,
            batch_size=len(plan.req_ids),
            prefill_tokens=plan.num_prefill_tokens,
            decode_tokens=plan.num_decode_tokens,
            running=len(sched.running),
            waiting=len(sched.waiting),
            kv_live_slots=live,
            kv_reserved_slots=reserved,
            kv_free_blocks=free_blocks,
            preemptions=len(plan.preempted_req_ids),
            swapped_blocks=len(plan.swap_in) + len(plan.swap_out),
        )
        self.num_steps += 1
        return finished

    def _streaming(self, plan: StepPlan) -> float:
        """Seconds an API server in the engine's own process spends streaming the step's outputs,
        one by one, before the next step can start (vLLM 0.5.x: run/frontend.py ``stream_ms``)."""
        return self.stream_s * (plan.num_reqs - len(plan.partial_rows)) if self.stream_s else 0.0

    def _execute(self, plan: StepPlan) -> StepOutput:
        """The backend's answer to ``plan``, checked: a plugin's wrong answer stops the run naming it."""
        # called as Python calls it, so that the answer reaches the check below as the plugin gave
        # it (compiled, a direct call would first check it is a StepOutput: a bare TypeError)
        execute: Callable[[StepPlan], object] = self.backend.execute
        output = execute(plan)
        if not (isinstance(output, StepOutput) and _well_formed(output, plan)):
            raise EngineError(_bad_output(self.backend, plan, output))
        return output

    def _update(self, plan: StepPlan, output: StepOutput, end: float) -> list[Request]:
        """The scheduler advances its requests by the step's tokens; returns those that finished."""
        try:
            return self.scheduler.update(plan, output, end)
        except (TypeError, OverflowError):
            # a token id that is no integer >= 0 fails in the scheduler: name the backend instead
            if all(map(_is_token, output.token_ids)):
                raise
            raise EngineError(_bad_output(self.backend, plan, output)) from None

    def run(
        self,
        requests: list[Request],
        on_step: Callable[[float, list[Request]], None] | None = None,
        max_concurrency: int | None = None,
    ) -> EngineResult:
        """Replay ``requests`` at their arrival times (and, with ``max_concurrency``, no more
        than that many in flight: ``arrivals``) until every one has finished.

        ``on_step(now, finished)`` is called after every step with the requests it finished."""
        arrivals = feed(requests, max_concurrency)
        clock, sched = self.clock, self.scheduler
        clock.start()
        error, interrupted = None, False
        try:
            while True:
                now = clock.now()
                for req in arrivals.due(now):
                    sched.add_request(req, now)
                    if req.is_finished:  # rejected at the door
                        arrivals.finished([req], now)
                if not sched.has_unfinished():
                    next_time = arrivals.next_time()
                    if next_time is None:
                        break
                    clock.wait_until(next_time)
                    continue
                finished = self.step()
                if finished:
                    arrivals.finished(finished, clock.now())
                if on_step is not None:
                    on_step(clock.now(), finished)
        except EngineError as e:
            error = str(e)
        except KeyboardInterrupt:
            error, interrupted = "interrupted", True
        except Exception as e:  # a policy plugin's bug (or ours): stop as on an EngineError, keep what ran
            error = crash_message(e)
            log.exception("the run stopped: %s", error)
        if error is not None:
            reason = FinishReason.ABORT if interrupted else FinishReason.ERROR
            sched.abort_all(reason, clock.now(), error, submitted=arrivals.requests, unsent=arrivals.pending())
        return self.result(arrivals.requests, error, interrupted)

    def result(self, reqs: list[Request], error: str | None, interrupted: bool) -> EngineResult:
        """What the engine has done so far, for ``reqs``: its step records, counters and leaks
        (``run`` ends with it; a cluster asks each replica's engine for it)."""
        sched, counters = self.scheduler, self.allocator.counters
        return EngineResult(
            requests=reqs,
            steps=self.steps,
            duration=_duration(self.steps, reqs),
            layout=self.allocator.layout,
            kv_bytes_per_token=self.backend.kv_bytes_per_token,
            num_preemptions=sched.num_preemptions,
            recomputed_tokens=sched.recomputed_tokens,
            swapped_blocks=sched.swapped_blocks,
            prefix_query_tokens=counters.prefix_query_tokens,
            prefix_hit_tokens=counters.prefix_hit_tokens,
            preempted_prefix_query_tokens=counters.preempted_prefix_query_tokens,
            preempted_prefix_hit_tokens=counters.preempted_prefix_hit_tokens,
            error=error,
            interrupted=interrupted,
            leaks=_leaks(self.allocator),
        )


def _duration(steps: StepRecords, reqs: list[Request]) -> float:
    """From the start until every request has returned, as vLLM's ``benchmark_duration``: the
    last request's end (a multi-step window may run on after it: vLLM computes its batch to the
    window's last step, and those steps return nothing), or the last step's where none ended."""
    ends = [r.finish_time for r in reqs if r.finish_time is not None]
    if ends:
        return max(ends)
    last = steps.last()
    return last.time if last is not None else 0.0


def _well_formed(output: StepOutput, plan: StepPlan) -> bool:
    """One token per row and a duration >= 0 (any int and float: numpy's too)."""
    try:  # compiled, reading a field checks its declared type: token ids not in a list, a duration that is no number
        return len(output.token_ids) == plan.num_reqs and output.duration >= 0
    except TypeError:
        return False


def _is_token(token: object) -> bool:
    """An int >= 0 (numpy's too): a vocabulary index."""
    return isinstance(token, SupportsIndex) and operator.index(token) >= 0


def _bad_output(backend: Executor, plan: StepPlan, output: object) -> str:
    # its fields as the plugin filled them (compiled, reading them typed would check their types first)
    tokens: object = getattr(output, "token_ids", None)
    duration: object = getattr(output, "duration", None)
    if isinstance(output, StepOutput) and isinstance(tokens, (list, tuple)):
        kinds = "/".join(sorted({type(t).__name__ for t in tokens}))
        shown = counted(len(tokens), "token") + (f" ({kinds})" if kinds else "") + f" and a duration of {duration!r} s"
    else:
        shown = type(output).__name__
    return (f"backend {backend.name!r} returned {shown} for a step of {counted(len(plan.req_ids), 'row')} (requests "
            "in plan.req_ids): execute() returns a paged_bench.core.plan.StepOutput of one token id (an int >= 0) per row of "
            "the plan and a duration >= 0 s")  # fmt: skip


def _leaks(allocator: Allocator) -> list[str]:
    """What the allocator still holds, each named by it (its own messages are plugins' text)."""
    return [f"allocator {allocator.name!r}: {m}" for m in allocator.leaks()] or _pool_not_whole(allocator)


def _pool_not_whole(allocator: Allocator) -> list[str]:
    """What an allocator's own ``leaks`` can miss (a plugin's that returns []), checked by the
    engine: once every request has ended, every block is free again and no slot is live."""
    name, free, total = allocator.name, allocator.num_free_blocks, allocator.layout.num_blocks
    found = [f"allocator {name!r} has {free} of {total} blocks free"] if free != total else []
    return found + ([f"allocator {name!r} counts {allocator.live_slots} live slots"] if allocator.live_slots else [])
