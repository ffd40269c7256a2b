"""The engine's two clocks: virtual time for cost-model backends, wall time for real ones.

Both count seconds from ``start()``. ``advance(start, duration)`` ends a step: the virtual
clock jumps by the modelled duration; the wall clock reads real time, first sleeping out a
modelled duration if one is given (so a simulated engine can be paced in real time, e.g.
behind the HTTP server). ``wait_until`` idles to the next arrival: a jump, or a sleep.

``STEP_TIMERS``: how a real model's step is timed on virtual time (``backend.step_timer``).
``wall`` reads elapsed time (``time.perf_counter``): what the step took, including whatever
other processes took of the core meanwhile (on a shared 2-core VM 10-40% more). ``thread_cpu``
reads the calling thread's CPU time (``time.thread_time``, CLOCK_THREAD_CPUTIME_ID): the step
as if it had the core alone, which other processes cannot stretch by taking turns on the core
(they still can by sharing its caches and memory bandwidth); it counts no other thread, so it
is honest only for a backend computing on the calling thread alone (``backend.threads=1``).
"""

from __future__ import annotations

import threading
import time

from paged_bench.errors import EngineError

# ~31,700 years: no serving run gets near it, and its times in ms (x 1e3) and their sums stay far
# from float's overflow, where a cost mistyped by orders of magnitude would turn figures inf or nan
HORIZON_S = 1e12


def past_horizon(t: float, what: str) -> EngineError:
    return EngineError(f"the simulated clock would pass {HORIZON_S:.0e} s (~31,700 years) at {t:.3g} s: {what}")


class VirtualClock:
    kind = "virtual"

    def __init__(self) -> None:
        self._now = 0.0

    def start(self) -> None:
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def advance(self, start: float, duration: float) -> float:
        now = start + duration
        if not now < HORIZON_S:  # also inf and nan; the clock stays where it was
            raise past_horizon(now, f"a step of {duration:.3g} s (a cost model's terms too large)")
        self._now = now
        return now

    def wait_until(self, t: float) -> None:
        if not t < HORIZON_S:
            raise past_horizon(t, "an arrival")
        self._now = max(self._now, t)


class WallClock:
    kind = "wall"

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def advance(self, start: float, duration: float) -> float:
        if duration > 0:
            self.wait_until(start + duration)
        return self.now()

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if not delay < threading.TIMEOUT_MAX:  # time.sleep's limit (~292 years), which it overflows
            raise EngineError(f"the wall clock would wait {delay:.3g} s for a step or an arrival (a cost model's "
                              "terms too large for a run paced in real time)")  # fmt: skip
        if delay > 0:
            time.sleep(delay)


STEP_TIMERS = {"wall": time.perf_counter, "thread_cpu": time.thread_time}


def make_clock(kind: str) -> VirtualClock | WallClock:
    return VirtualClock() if kind == "virtual" else WallClock()
