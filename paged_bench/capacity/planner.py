"""The plan's loop: candidates pruned before they are simulated, rate searches advanced in
waves of simulations through the launcher, cheapest first, and the answer picked.

Pruned, with the reason counted: a candidate the engine refuses to build (its weights do not
fit the GPU, or its KV pool cannot hold one longest request: ``run.bench``'s own checks), one
that costs more than a candidate already measured to meet the target (it cannot be cheaper),
and one whose capacity is bounded below what a candidate costing no more already serves
(dominated on cost and capacity). The winner is the cheapest candidate that meets the target.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from paged_bench.capacity.search import RateSearch, SearchSettings, rounded
from paged_bench.capacity.space import Candidate
from paged_bench.errors import PagedBenchError

# a wave runs the next scale of this many candidates, cheapest first: wide enough to keep the
# launcher's workers busy, narrow enough that a pass prunes what costs more before it runs
DEFAULT_WAVE = 4


@dataclass
class Entry:
    """One candidate's state in a plan."""

    candidate: Candidate
    search: RateSearch
    pruned: str | None = None  # why it stopped before its search was done (or never began)
    trials: list[dict[str, Any]] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return bool(self.search.tried)

    @property
    def active(self) -> bool:
        return self.pruned is None and not self.search.done


@dataclass
class PlanResult:
    entries: list[Entry]
    target: float
    winner: Entry | None
    num_trials: int  # simulations run now
    num_reused: int  # read back from an earlier run's folders
    trial_cpu_s: float  # CPU time of the simulations run now (their own processes')
    wall_s: float

    def pruned_counts(self) -> Counter[str]:
        return Counter(e.pruned.split(":")[0] for e in self.entries if e.pruned)


# a simulation of a candidate at a scale: the trial record (``trial.simulate``'s, with "scale")
Runner = Callable[[list[tuple[Entry, float]]], list[dict[str, Any]]]
Sizer = Callable[[Candidate], str | None]  # why the engine refuses it, or None


def prune_unbuildable(entries: list[Entry], refuses: Sizer) -> None:
    """The engine's own checks, once per engine shape (a split's replicas share one)."""
    seen: dict[tuple[Any, ...], str | None] = {}
    for e in entries:
        shape = tuple(e.candidate.engine_overrides())
        if shape not in seen:
            seen[shape] = refuses(e.candidate)
        if seen[shape]:
            e.pruned = seen[shape]


def _prune_dominated(entries: list[Entry], target: float) -> None:
    measured = [e for e in entries if e.measured]
    meeting = [e for e in measured if e.search.meets(target)]
    cheapest = min((e.candidate.usd_per_hour for e in meeting), default=math.inf)
    for e in entries:
        if not e.active:
            continue
        cost = e.candidate.usd_per_hour
        if cost > cheapest:
            best = min(meeting, key=lambda m: m.candidate.usd_per_hour)
            e.pruned = (f"costs more: ${cost:,.2f}/h > ${cheapest:,.2f}/h of {best.candidate.label}, which meets the "
                        "target")  # fmt: skip
            continue
        if e.search.meets(target):
            continue  # serves the target: its own capacity is worth knowing
        for m in measured:
            if m is not e and m.candidate.usd_per_hour <= cost and m.search.capacity >= e.search.upper:
                e.pruned = (f"dominated: capacity < {e.search.upper:g}x, and {m.candidate.label} serves "
                            f"{m.search.capacity:g}x for ${m.candidate.usd_per_hour:,.2f}/h")  # fmt: skip
                break


def guess(entry: Entry, entries: list[Entry]) -> tuple[float, float] | None:
    """A bracket for ``entry``'s capacity, its search's first guess: the bracket of the measured
    candidate of its family (``Candidate.family``) nearest in size, scaled by the sizes' ratio
    (capacity grows about in proportion to the replicas that bind it); None where none is known."""
    c = entry.candidate
    known = [e for e in entries if e.candidate.family == c.family and e.search.lo and e.search.hi is not None
             and e.search.next_scale() is None]  # fmt: skip
    if not known:
        return None
    near = min(known, key=lambda e: abs(math.log(e.candidate.size / c.size)))
    ratio = c.size / near.candidate.size
    return near.search.capacity * ratio, near.search.upper * ratio


def run_plan(candidates: list[Candidate], settings: SearchSettings, runner: Runner, refuses: Sizer,
             wave: int = DEFAULT_WAVE, on_wave: Callable[[list[Entry]], None] | None = None) -> PlanResult:  # fmt: skip
    """Search every candidate that survives pruning; the cheapest that meets the target wins."""
    started = time.monotonic()
    entries = [Entry(c, RateSearch(settings)) for c in candidates]
    prune_unbuildable(entries, refuses)
    if all(e.pruned for e in entries):
        raise PagedBenchError(f"no candidate of the {len(entries)} in plan.space can be built: "
                              f"{entries[0].pruned if entries else 'none given'}")  # fmt: skip
    num_trials = num_reused = 0
    cpu = 0.0
    while True:
        _prune_dominated(entries, settings.target)
        batch = [e for e in entries if e.active][:wave]  # cheapest first (candidates come sorted)
        if not batch:
            break
        for e in batch:  # a guess steers a search after its first scale (the target)
            if e.search.guess is None and len(e.search.tried) <= 1:
                e.search.guess = guess(e, entries)
        steps = [(e, e.search.next_scale()) for e in batch]
        records = runner([(e, rounded(s)) for e, s in steps if s is not None])
        for (entry, _), record in zip(steps, records):
            entry.search.record(record["scale"], bool(record["passed"]))
            entry.trials.append(record)
            if record.get("reused"):
                num_reused += 1
            else:
                num_trials += 1
                cpu += record.get("cpu_s") or 0.0
        if on_wave is not None:
            on_wave(batch)
    meeting = [e for e in entries if e.search.meets(settings.target)]
    winner = min(meeting, key=lambda e: (e.candidate.usd_per_hour, -e.search.capacity), default=None)
    return PlanResult(entries, settings.target, winner, num_trials, num_reused, cpu, time.monotonic() - started)


def ranked(result: PlanResult) -> list[Entry]:
    """Those that meet the target, cheapest first, then the rest by capacity per dollar."""

    def key(e: Entry) -> tuple[Any, ...]:
        meets = e.search.meets(result.target) is True
        return (not meets, e.candidate.usd_per_hour if meets else -e.search.capacity / e.candidate.usd_per_hour)

    return sorted((e for e in result.entries if e.measured), key=key)


def best_figures(result: PlanResult, names: list[str]) -> dict[str, float]:
    """Each SLO figure at its best (lowest) over every simulation that measured it whole."""
    out = {}
    for name in names:
        values = [t["figures"][name] for e in result.entries for t in e.trials if t["figures"].get(name) is not None]
        if values:
            out[name] = min(values)
    return out


def unmet_line(result: PlanResult, slo_text: str, names: list[str]) -> str:
    """The line for a plan no candidate wins: the best capacity reached, and the best figures."""
    top = max((e for e in result.entries if e.measured), key=lambda e: e.search.capacity, default=None)
    best = ", ".join(f"{k} {v:,.1f}" for k, v in best_figures(result, names).items())
    reach = f"the best serves {top.search.capacity:g}x ({top.candidate.label})" if top else "nothing was simulated"
    return (f"plan.slo={{{slo_text}}} is not met at plan.target_scale={result.target:g} by any candidate: {reach}; "
            f"best figures measured: {best or 'none (every run stopped early)'}")  # fmt: skip
