"""Where a whole simulated run spends its time, per engine step: the diagnostic behind
``sim_speed.py``'s figure (issue 11's 40,000 steps/s goal).

Part 1 runs the 20,000-request Poisson job in-process, phase by phase as ``app.run_job``
does (build the workload and engine, the step loop, the request records, the summary, the
run's files), and prints each phase's CPU time per engine step, and how much of it the cyclic
garbage collector took (timed through ``gc.callbacks``).

Part 2 prices the step loop's parts on small runs built to isolate each one, and checks
that they add up to the measured loop:

- fixed cost of a step: one running sequence, decode only (block size 256: no block fills);
- per running row: 32 sequences decoding, less the fixed cost, over 31 more rows;
- per KV block filled while decoding (it is hashed and indexed, the next one is allocated,
  evicting a cached block): block size 16 against 256 at 32 sequences, over the blocks
  per step (32 rows / 16);
- per request (admission with its prompt's blocks allocated, hashed and indexed, then
  finish and free): one-token outputs, 32 requests a step, less the fixed and per-row costs.

Part 3 prices the prefix cache: the same job's step loop hashing every full block
(``allocator.defer_unshared=false``, as vLLM does) and with no prefix caching at all.

All times are CPU time of this process (``time.process_time``), so other work on the
machine's other core moves them less than wall time; medians of ``--repeats`` runs. Run
from the repository root:

    .venv/bin/python benchmarks/sim_breakdown.py
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from paged_bench.results.metrics import summarize
from paged_bench.results.records import RequestRecords
from paged_bench.results.run_files import write_run
from paged_bench.run.bench import build
from paged_bench.run.compose import compose_config
from paged_bench.run.outcome import JobOutcome, capacity_figures, run_info

POISSON_20K = ["workload=poisson", "max_batch=32", "workload.rate=14", "workload.num_requests=20000"]
DECODE = ["workload=poisson", "workload.num_requests=1000", "workload.rate=1000", "workload.prompt_len=16",
          "workload.output_len=256"]  # fmt: skip
PREFILL = ["workload=poisson", "workload.num_requests=8000", "workload.rate=100000", "workload.output_len=1",
           "max_batch=32"]  # fmt: skip
TARGET_US_PER_STEP = 1e6 / 40_000


def config(overrides: list[str]) -> dict:
    return compose_config("backend=sim", "tracking.enabled=false", *overrides)


def cpu(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


class GcClock:
    """Time the cyclic garbage collector takes (a ``gc.callbacks`` entry), and its collections
    by generation (2: full)."""

    def __init__(self) -> None:
        self.seconds, self.collections, self._started = 0.0, [0, 0, 0], 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1



@contextmanager
def gc_clocked() -> Iterator[GcClock]:
    clock = GcClock()
    gc.callbacks.append(clock)
    try:
        yield clock
    finally:
        gc.callbacks.remove(clock)


def job_phases(overrides: list[str]) -> tuple[dict[str, float], dict[str, float], GcClock]:
    """(the job's shape: steps, rows, full blocks, requests; CPU seconds per phase; the garbage
    collector's share) of one job, phase by phase as app.run_job runs it."""
    with gc_clocked() as collector:
        shape, phases = _job_phases(overrides)
    return shape, phases, collector


def _job_phases(overrides: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    cfg = config(overrides)
    t_build, bench = cpu(lambda: build(cfg))
    t_run, result = cpu(lambda: bench.engine.run(bench.requests))
    t_rec, records = cpu(lambda: RequestRecords.from_requests(result.requests))
    t_sum, summary = cpu(lambda: summarize(result, cfg.get("slo"), records))
    summary.update(capacity_figures(result.layout, 1, summary.get("output_throughput")))
    with tempfile.TemporaryDirectory() as d:
        outcome = JobOutcome(Path(d), summary, result, bench.choices, [], records)
        info = run_info(outcome, "engine", bench.kv_budget)
        t_write, _ = cpu(lambda: write_run(Path(d), result, summary, info, records))
    phases = {"workload + engine build": t_build, "step loop": t_run, "request records": t_rec,
              "summary figures": t_sum, "files written": t_write}  # fmt: skip
    bs = result.layout.block_size
    shape = {"steps": len(result.steps), "rows": int(result.steps.column("batch_size").sum()),
             # blocks filled while decoding (a prompt's full blocks are part of its admission); a
             # request's last token is sampled, never computed: its K/V fills (tokens - 1) slots
             "blocks": sum((r.num_tokens - 1) // bs - r.num_prompt_tokens // bs for r in result.requests),
             "requests": len(result.requests)}  # fmt: skip
    return shape, phases


def loop_cost(overrides: list[str]) -> tuple[float, int, int]:
    """(CPU seconds of the step loop, steps, requests) of one run."""
    bench = build(config(overrides))
    seconds, result = cpu(lambda: bench.engine.run(bench.requests))
    return seconds, len(result.steps), len(result.requests)


def median_of(repeats: int, fn: Callable[[], tuple]) -> tuple:
    runs = [fn() for _ in range(repeats)]
    return tuple(statistics.median(r[i] for r in runs) for i in range(len(runs[0])))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement (median)")
    args = p.parse_args(argv)
    n = args.repeats

    runs = [job_phases(POISSON_20K) for _ in range(n)]
    shape = runs[0][0]
    steps = shape["steps"]
    phases = {name: statistics.median(r[1][name] for r in runs) for name in runs[0][1]}
    total = sum(phases.values())
    print(f"## Part 1: the 20,000-request Poisson job ({steps:,} steps), CPU us per step\n")
    print("| phase | us per step | share |\n|---|---:|---:|")
    for name, seconds in phases.items():
        print(f"| {name} | {seconds / steps * 1e6:.1f} | {seconds / total:.0%} |")
    print(f"| **all but start-up** | **{total / steps * 1e6:.1f}** | {steps / total:,.0f} steps/s |")
    collector = min((r[2] for r in runs), key=lambda c: c.seconds)
    young, middle, full = collector.collections
    print(f"\nof which in the cyclic garbage collector: {collector.seconds / steps * 1e6:.2f} us per step "
          f"({young} young, {middle} middle and {full} full collections; the least of the runs)")  # fmt: skip
    print(f"\nissue 11's goal, 40,000 steps/s, is {TARGET_US_PER_STEP:.0f} us per step for all of these together.\n")

    one, one_steps, _ = median_of(n, lambda: loop_cost([*DECODE, "max_batch=1", "block_size=256"]))
    fixed = one / one_steps
    wide, wide_steps, _ = median_of(n, lambda: loop_cost([*DECODE, "max_batch=32", "block_size=256"]))
    per_row = (wide / wide_steps - fixed) / 31
    small, small_steps, _ = median_of(n, lambda: loop_cost([*DECODE, "max_batch=32", "block_size=16"]))
    per_block = (small / small_steps - wide / wide_steps) / (32 / 16)
    fill, fill_steps, fill_reqs = median_of(n, lambda: loop_cost(PREFILL))
    per_request = (fill - fill_steps * (fixed + 31 * per_row)) / fill_reqs

    loop = phases["step loop"] / steps * 1e6
    rows, blocks, reqs = (shape[k] / steps for k in ("rows", "blocks", "requests"))
    model = {"fixed, per step": fixed * 1e6, f"{rows:.1f} running rows x {per_row * 1e6:.2f} us": rows * per_row * 1e6,
             f"{blocks:.1f} blocks x {per_block * 1e6:.2f} us": blocks * per_block * 1e6,
             f"{reqs:.2f} requests x {per_request * 1e6:.1f} us": reqs * per_request * 1e6}  # fmt: skip
    print("## Part 2: the step loop's parts (CPU us), priced on runs that isolate each\n")
    print("| part | us per step in the Poisson job |\n|---|---:|")
    for name, us in model.items():
        print(f"| {name} | {us:.1f} |")
    parts = sum(model.values())
    same, same_steps, _ = median_of(n, lambda: loop_cost([*POISSON_20K, "workload.output_len=64"]))
    print(f"| sum of the parts | {parts:.1f} |\n| the rest (not priced above) | {loop - parts:.1f} |")
    print(f"| step loop as measured in part 1 | {loop:.1f} |")
    print(
        f"| the same job with every output 64 tokens long (`workload.output_len=64`) | {same / same_steps * 1e6:.1f} |"
    )
    print(f"\nMedians of {n} runs each. Rows, blocks filled and requests per step are the Poisson job's.\n")
    print("## Part 3: what the prefix cache costs the step loop (the Poisson job, no prompt shared)\n")
    print("| step loop of the Poisson job | CPU us per step |\n|---|---:|")
    print(f"| as configured (blocks hashed once another chain could hit them) | {loop:.1f} |")
    for label, knob in (
        ("every full block hashed (`allocator.defer_unshared=false`, as vLLM)", "allocator.defer_unshared=false"),
        ("no prefix caching (`allocator.prefix_caching=false`)", "allocator.prefix_caching=false"),
    ):
        seconds, loop_steps, _ = median_of(n, lambda k=knob: loop_cost([*POISSON_20K, k]))
        print(f"| {label} | {seconds / loop_steps * 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
