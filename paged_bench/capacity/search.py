"""The search over one candidate's arrival-rate scale: the highest scale of the workload's
own rate at which the candidate still meets the SLO, to a stated precision.

It starts at the target scale (the question asked), doubles up from a pass or halves down
from a failure until both sides are known (within ``[min_scale, max_scale]``), then bisects
in log space until the highest passing scale and the lowest failing one are within
``precision`` of each other (``hi <= lo * (1 + precision)``): the capacity is ``lo``, and the
true one lies in ``[lo, hi)``. Given a ``guess`` of the bracket (the planner's, from a measured
neighbour), its ends are tried, where they lie inside what is known, before any doubling,
halving or bisection: a guess that holds ends the search in two or three simulations, one that
does not costs a simulation or two more than none (the search goes on from there as without). A scale is rounded to four significant digits, so that the
command line that reruns it says the same number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from paged_bench.errors import check, check_number


def rounded(scale: float) -> float:
    return float(f"{scale:.4g}")


@dataclass(frozen=True)
class SearchSettings:
    target: float  # the load to meet, as a multiple of the workload's own rate
    precision: float = 0.05  # relative width of the final bracket
    min_scale: float = 0.0625  # below this a candidate's capacity is reported as "< min_scale"
    max_scale: float = 64.0

    def __post_init__(self) -> None:
        check_number("plan.target_scale", self.target, 0, strict=True)
        check_number("plan.search.precision", self.precision, 0.001)
        check_number("plan.search.min_scale", self.min_scale, 0, strict=True)
        check(
            self.max_scale >= self.target >= self.min_scale,
            "plan.search.max_scale",
            self.max_scale,
            f"a range [plan.search.min_scale, plan.search.max_scale] that holds plan.target_scale={self.target}",
        )


@dataclass
class RateSearch:
    settings: SearchSettings
    lo: float | None = None  # the highest scale that met the SLO
    hi: float | None = None  # the lowest scale that did not
    tried: list[tuple[float, bool]] = field(default_factory=list)  # (scale, met) in the order run
    guess: tuple[float, float] | None = None  # a predicted (lo, hi): where to look after the target

    def record(self, scale: float, passed: bool) -> None:
        self.tried.append((scale, passed))
        if passed:
            self.lo = scale if self.lo is None else max(self.lo, scale)
        else:
            self.hi = scale if self.hi is None else min(self.hi, scale)

    def next_scale(self) -> float | None:
        """The next scale to simulate, or None when the search is done."""
        s, lo, hi = self.settings, self.lo, self.hi
        if lo is None and hi is None:
            return rounded(s.target)
        if lo is None:
            assert hi is not None
            if hi <= s.min_scale:
                return None
            return self._guessed() or rounded(max(hi / 2, s.min_scale))
        if hi is None:
            if lo >= s.max_scale:
                return None
            return self._guessed() or rounded(min(lo * 2, s.max_scale))
        if hi <= lo * (1 + s.precision):
            return None
        mid = rounded(math.sqrt(lo * hi))
        return self._guessed() or (mid if lo < mid < hi else None)

    def _guessed(self) -> float | None:
        """An end of the guess (lo, then hi; within the scale range) not yet tried that lies
        between what passed and what failed: once both are tried, the search goes on as without."""
        s, low, high = self.settings, self.lo or 0.0, self.upper
        for end in self.guess or ():
            scale = rounded(min(max(end, s.min_scale), s.max_scale))
            if low < scale < high:  # (a tried scale is at or below lo, or at or above hi)
                return scale
        return None

    @property
    def done(self) -> bool:
        return self.next_scale() is None

    @property
    def capacity(self) -> float:
        """The highest scale that met the SLO (0 when none did, down to ``min_scale``)."""
        return self.lo or 0.0

    @property
    def upper(self) -> float:
        """What the capacity is below: the lowest scale that failed (inf: none did, up to ``max_scale``)."""
        return math.inf if self.hi is None else self.hi

    def meets(self, target: float) -> bool | None:
        """Whether it serves ``target``; None while unknown."""
        if self.lo is not None and self.lo >= target:
            return True
        if self.hi is not None and self.hi <= target:
            return False
        return None
