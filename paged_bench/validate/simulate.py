"""One published case, simulated: its workload written as a trace, its config composed as
``python -m paged_bench`` composes it (the case file's ``setup`` and the case's overrides,
its GPU, model and TP), run in-process by the same job code (``run.job.run_job``), in a
folder of its own that is removed afterwards, within a time limit."""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paged_bench.errors import PagedBenchError
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job
from paged_bench.validate.cases import Case, Figure
from paged_bench.validate.workloads import write_trace

SEED = 0  # the modelled lengths' and arrivals' draw: the table is the same every time


class CaseTimeout(PagedBenchError):
    """A case ran past its time limit."""


@dataclass(frozen=True)
class Compared:
    """One published figure and what the simulator made of it."""

    case: Case
    figure: Figure
    simulated: float | None  # None: the case failed (``error`` says why)
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        return None if self.simulated is None else self.simulated / self.figure.published


def case_overrides(case: Case, trace: Path, seed: int = SEED) -> list[str]:
    """What ``python -m paged_bench`` would be given to run ``case`` on ``trace``."""
    return ["backend=sim", "workload=trace", f"workload.path={trace}", f"seed={seed}", "tracking.enabled=false",
            f"backend.hardware={case.gpu}", f"backend.model={case.model}",
            f"backend.tensor_parallel_size={case.tp}", *case.overrides]  # fmt: skip


def run_case(case: Case, time_limit_s: float, seed: int = SEED) -> list[Compared]:
    """``case`` simulated and each of its figures compared; a case that fails or runs past
    ``time_limit_s`` gives its figures an error instead of a value (the other cases still run).
    ``seed``: the draw of its requests (the registry's table uses SEED; other draws show how much
    a figure rests on which requests were drawn: benchmarks/sharegpt_draws.py)."""
    with tempfile.TemporaryDirectory(prefix="paged_bench_validate_") as tmp:
        trace = write_trace(case.workload, Path(tmp) / "requests.csv", seed)
        try:
            cfg = compose_config(*case_overrides(case, trace, seed))
            with _time_limit(time_limit_s):
                summary = run_job(cfg, Path(tmp) / "run").summary
        except CaseTimeout as e:
            return [Compared(case, f, None, str(e)) for f in case.figures]
        except (PagedBenchError, ValueError, TypeError) as e:  # Hydra refuses an override with these
            return [Compared(case, f, None, f"{type(e).__name__}: {str(e).splitlines()[0]}") for f in case.figures]
    return [Compared(case, f, _figure_value(summary, f.metric)) for f in case.figures]


def _figure_value(summary: dict[str, Any], metric: str) -> float:
    if metric == "duration_ms":
        return float(summary["duration"]) * 1e3
    return float(summary[metric])


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise CaseTimeout in the block after ``seconds`` of wall time (the main thread's alarm)."""

    def expire(signum: int, frame: object) -> None:
        raise CaseTimeout(f"ran past its {seconds:g} s limit (--case-timeout)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
