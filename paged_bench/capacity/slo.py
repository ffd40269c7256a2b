"""A plan's SLO (``plan.slo``): latency percentiles a deployment must keep, read from the keys
``<latency>_p<N>_ms`` (``ttft_p90_ms: 500``: 90% of requests see their first token within
500 ms), checked on a run's summary (``p90_ttft_ms``, as ``python -m paged_bench`` writes it).

A simulation that has already broken its SLO stops there (``Watch``): once more requests have
exceeded a limit than the percentile lets through, no later request can bring it back (a
request's TTFT is over once its deadline passes with no first token). The
count is taken against every request of the workload, an upper bound on those the summary's
percentile is over, so a run stopped early is one that would have failed whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from paged_bench.core.request import Request
from paged_bench.errors import ConfigError, check_number

LATENCIES = ("ttft", "tpot", "e2el", "itl")
KEY = re.compile(r"^(ttft|tpot|e2el|itl)_p(50|90|95|99)_ms$")
ALLOWED = "keys <latency>_p<N>_ms (latency ttft, tpot, e2el or itl; N 50, 90, 95 or 99), e.g. ttft_p90_ms: 500"


class Broken(KeyboardInterrupt):
    """Raised from a run's step callback to stop a simulation that broke its SLO: the engine
    ends a run it is interrupted in with everything it measured, as on Ctrl-C."""


@dataclass(frozen=True)
class Limit:
    latency: str
    percentile: int
    ms: float

    @property
    def summary_key(self) -> str:
        """The figure a run's summary gives it (``p90_ttft_ms``; the 50th is the median)."""
        return f"{'median' if self.percentile == 50 else f'p{self.percentile}'}_{self.latency}_ms"

    @property
    def name(self) -> str:
        return f"{self.latency}_p{self.percentile}_ms"


@dataclass(frozen=True)
class Slo:
    limits: tuple[Limit, ...]

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> Slo:
        limits = []
        for key, value in (section or {}).items():
            match = KEY.match(str(key))
            if match is None:
                raise ConfigError(f"plan.slo.{key}", value, ALLOWED)
            if value is not None:
                ms = check_number(f"plan.slo.{key}", value, 0, strict=True)
                limits.append(Limit(match[1], int(match[2]), ms))
        if not limits:
            raise ConfigError("plan.slo", dict(section or {}), f"at least one limit: {ALLOWED}")
        return cls(tuple(limits))

    def figures(self, summary: Mapping[str, Any]) -> dict[str, float | None]:
        return {limit.name: summary.get(limit.summary_key) for limit in self.limits}

    def missed(self, figures: Mapping[str, float | None]) -> list[str]:
        """The limits ``figures`` break (a figure the run could not measure breaks its limit)."""
        return [lim.name for lim in self.limits if figures.get(lim.name) is None or figures[lim.name] > lim.ms]

    def describe(self) -> str:
        return ", ".join(f"{lim.latency.upper()} p{lim.percentile} <= {lim.ms:g} ms" for lim in self.limits)


def _latency_s(req: Request, latency: str) -> float | None:
    """A finished request's TPOT or E2EL (a TTFT is checked by its deadline, ``Watch``)."""
    times = req.token_times
    if not times:
        return None
    if latency == "tpot":
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return times[-1] - req.arrival_time  # e2el (itl has no per-request figure: never stops a run early)


class Watch:
    """A run's step callback that stops it (``Broken``) once a limit can no longer be met.

    A TTFT limit is checked as each request's deadline passes (``arrival + limit`` before the
    run's clock), not as it finishes: one still waiting for its first token then is over
    already, and an overloaded run is stopped as soon as its queue has made enough of them,
    not when they have waited and then decoded to their end. The other latencies are known
    when a request finishes."""

    def __init__(self, slo: Slo, requests: Sequence[Request], max_model_len: int,
                 now: Callable[[], float] | None = None) -> None:  # fmt: skip
        """``requests``: the workload's; ``max_model_len``: the engine's (a longer prompt is
        refused at the door and has no TTFT); ``now``: the time before which the run can stamp
        no more tokens, when that is not the time the callback is given (a cluster: a replica's
        step ends later than the next may begin)."""
        self.limits = [lim for lim in slo.limits if lim.latency != "itl"]
        num_requests = len(requests)
        # p_q of N values is above L once more than (1 - q) N + 1 of them are (numpy's linear interpolation
        # then reads two values above L): the +1 keeps the stop sound at any N
        self.allowed = [(100 - lim.percentile) * num_requests / 100 + 1 for lim in self.limits]
        self.over = [0] * len(self.limits)
        self.broken: str | None = None
        self.clock = now
        # TTFT: the servable requests by deadline, and how far the clock has passed them
        self.by_arrival = sorted((r for r in requests if 0 < r.num_prompt_tokens < max_model_len),
                                 key=lambda r: r.arrival_time)  # fmt: skip
        self.passed = [0] * len(self.limits)

    def on_step(self, now: float, finished: list[Request]) -> None:
        if self.clock is not None:
            now = self.clock()
        for i, lim in enumerate(self.limits):
            if lim.latency == "ttft":
                self.over[i] += self._past_deadline(i, now, lim.ms / 1000)
            elif finished:
                seconds = lim.ms / 1000
                self.over[i] += sum(1 for req in finished if (_latency_s(req, lim.latency) or 0.0) > seconds)
            if self.over[i] > self.allowed[i]:
                self.broken = (f"{lim.name}: {self.over[i]} requests over {lim.ms:g} ms by t={now:.1f} s "
                               f"(more than the {100 - lim.percentile}% the percentile lets through)")  # fmt: skip
                raise Broken

    def _past_deadline(self, i: int, now: float, seconds: float) -> int:
        """How many requests' deadlines ``now`` has newly passed with no first token by then."""
        reqs, k, over = self.by_arrival, self.passed[i], 0
        while k < len(reqs) and reqs[k].arrival_time + seconds < now:
            req = reqs[k]
            first = req.token_times[0] if req.token_times else None
            if (first is None and not req.is_finished) or (first is not None and first - req.arrival_time > seconds):
                over += 1
            k += 1
        self.passed[i] = k
        return over
