"""One published case, simulated: its workload written as a trace, its config composed as
``python -m paged_bench`` composes it (the case file's ``setup`` and the case's overrides,
its GPU, model and TP), run in-process by the same job code (``run.job.run_job``), in a
folder of its own that is removed afterwards, within a time limit."""

from __future__ import annotations

import math
import signal
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hydra.errors import HydraException

from paged_bench.cli.hydra_errors import hydra_error
from paged_bench.errors import PagedBenchError
from paged_bench.results.metrics import latency_stats, request_latencies
from paged_bench.results.records import RequestRecords
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job
from paged_bench.run.outcome import JobOutcome
from paged_bench.validate.cases import Case, Figure, Workload
from paged_bench.validate.workloads import write_trace

SEED = 0  # the modelled lengths' and arrivals' draw: the table is the same every time
# A ShareGPT case with every request at once runs until its longest request ends, so which
# conversations were drawn sets its figures (H100 8B throughput 0.76x-1.13x of vLLM's over 30
# draws with the published means, benchmarks/sharegpt_draws.py): it is simulated on this many
# draws and each figure is their mean (the median of a figure that jumps with the longest
# request drawn is one draw's value or another's), with their range beside it.
DRAWS_AT_ONCE = 9


class CaseTimeout(PagedBenchError):
    """A case ran past its time limit."""


@dataclass(frozen=True)
class Compared:
    """One published figure and what the simulator made of it."""

    case: Case
    figure: Figure
    simulated: float | None  # None: the case failed (``error`` says why); the mean over draws
    error: str | None = None
    low: float | None = None  # the least and greatest over the case's draws (``draw_seeds``)
    high: float | None = None
    draws: int = 1

    @property
    def ratio(self) -> float | None:
        return None if self.simulated is None else self.simulated / self.figure.published

    @property
    def ratio_range(self) -> tuple[float, float] | None:
        """The least and greatest ratio over the case's draws (None for one draw)."""
        if self.draws == 1 or self.low is None or self.high is None:
            return None
        return self.low / self.figure.published, self.high / self.figure.published


def draw_seeds(case: Case) -> range:
    """The seeds of the request draws ``case`` is simulated on: DRAWS_AT_ONCE for ShareGPT with
    every request at once, else one."""
    many = case.workload.dataset == "sharegpt" and math.isinf(case.workload.rate)
    return range(SEED, SEED + (DRAWS_AT_ONCE if many else 1))


def case_overrides(case: Case, trace: Path, seed: int = SEED) -> list[str]:
    """What ``python -m paged_bench`` would be given to run ``case`` on ``trace``."""
    return ["backend=sim", "workload=trace", f"workload.path={trace}", f"seed={seed}", "tracking.enabled=false",
            f"backend.hardware={case.gpu}", f"backend.model={case.model}",
            f"backend.tensor_parallel_size={case.tp}", *case.overrides]  # fmt: skip


def run_case(case: Case, time_limit_s: float, seeds: Sequence[int] | None = None) -> list[Compared]:
    """``case`` simulated on each of its draws (``seeds``, default ``draw_seeds(case)``) and each
    figure compared, as the mean over the draws; a case that fails or runs past
    ``time_limit_s`` (a draw) gives its figures an error instead of a value (the other cases
    still run). benchmarks/sharegpt_draws.py passes one seed at a time to show each draw."""
    seeds = draw_seeds(case) if seeds is None else seeds
    per_draw = []
    for seed in seeds:
        summary = _simulate(case, time_limit_s, seed)
        if isinstance(summary, str):
            return [Compared(case, f, None, summary) for f in case.figures]
        values = [_figure_value(summary, f.metric) for f in case.figures]
        if None in values:  # e.g. first_ttft_ms of a case whose every reply was empty
            absent = ", ".join(f.metric for f, v in zip(case.figures, values, strict=True) if v is None)
            return [Compared(case, f, None, f"the run gives no {absent}") for f in case.figures]
        per_draw.append(values)
    return [Compared(case, f, statistics.fmean(values), low=min(values), high=max(values), draws=len(values))
            for f, values in zip(case.figures, zip(*per_draw, strict=True), strict=True)]  # fmt: skip


def run_draw(case: Case, seed: int, folder: Path) -> JobOutcome:
    """``case`` simulated on draw ``seed``, its requests' trace and the run's files in ``folder``
    (vllm060_engine_burst.py counts its steps)."""
    trace = write_trace(case.workload, folder / "requests.csv", seed)
    return run_job(compose_config(*case_overrides(case, trace, seed)), folder / "run")


def _simulate(case: Case, time_limit_s: float, seed: int) -> dict[str, Any] | str:
    """The run's summary on draw ``seed``, or why it failed."""
    with tempfile.TemporaryDirectory(prefix="paged_bench_validate_") as tmp:
        try:
            with _time_limit(time_limit_s):
                outcome = run_draw(case, seed, Path(tmp))
            assert outcome.records is not None  # an engine run's records are its requests
            return client_summary(outcome.summary, outcome.records, case.workload)
        except CaseTimeout as e:
            return str(e)
        except HydraException as e:  # an override Hydra refuses (a case file's, or --override's)
            return hydra_error(e) or str(e).splitlines()[0]
        except (PagedBenchError, ValueError, TypeError) as e:  # Hydra refuses an override with these too
            return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def client_summary(summary: dict[str, Any], records: RequestRecords, workload: Workload) -> dict[str, Any]:
    """``summary`` as vLLM's benchmark_serving.py (v0.4-0.6) measured it, where that differs: its
    client takes a request's TTFT at the first streamed chunk that carries text, so a request whose
    first token ended it (a listed output of 0: the model's end of text, which sends no text) keeps
    the TTFT it starts with, 0.0, and ``calculate_metrics`` averages it in with the others'. Adds
    ``first_ttft_ms``, the least TTFT of a request that got text (with every request at once: when
    the first prompt step's tokens reached the client)."""
    ttft = client_ttfts_ms(records, workload)
    ttft = ttft[~np.isnan(ttft)]
    with_text = ttft[ttft > 0]
    figures = {**summary, "first_ttft_ms": float(with_text.min()) if with_text.size else None}
    if with_text.size < ttft.size:
        figures.update(latency_stats("ttft", ttft))
    return figures


def client_ttfts_ms(records: RequestRecords, workload: Workload) -> np.ndarray:
    """Each request's TTFT (ms) as vLLM's benchmark client took it, in the trace's order (a
    request's index in the trace is its id): 0.0 for a listed output of 0 (no text came), nan for a
    request that failed."""
    ttft = np.full(workload.num_requests, np.nan)
    done = records.succeeded
    ttft[np.asarray(records.request_id, dtype=np.int64)[done]] = request_latencies(records).ttft_ms[done]
    ended_at_once = [i for i, n in enumerate(workload.output_lens) if n == 0]
    ttft[ended_at_once] = np.where(np.isnan(ttft[ended_at_once]), np.nan, 0.0)
    return ttft


def _figure_value(summary: dict[str, Any], metric: str) -> float | None:
    """``metric`` of the run, or None where the run has none."""
    value = summary.get("duration" if metric == "duration_ms" else metric)
    if value is None:
        return None
    return float(value) * (1e3 if metric == "duration_ms" else 1.0)


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
