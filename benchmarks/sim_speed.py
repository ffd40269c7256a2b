"""Whole-run simulator speed: engine steps per second of wall time, as a user runs the command.

Each case runs ``python -m paged_bench ... backend=sim tracking.enabled=false`` as a subprocess
(imports, Hydra, workload build, the step loop, metrics and every output file included) and
counts the rows of its ``steps.csv``. Start-up is cancelled by running the same command cut to
50 requests right after it and taking the difference, per pair of runs:

    steps/s = (steps - steps_50) / (wall - wall_50)       (the median over --repeats pairs)

Pairing each run with its cut-down twin, rather than timing all of one and then all of the
other, keeps a machine that slows down for a minute from landing in one half only; the range
of the pairs' figures is printed beside the median, as what this machine's noise was. The
kernel's share of the difference is printed too: the minor page faults and system seconds the
full run takes beyond its twin (``getrusage`` of the child), memory the run's data is first
written to.

The seed workload has only 48 requests, so it is reported as whole-process seconds (issue 11:
under 1 s untracked) and steps over that time. Each case runs with the compiled engine core
(``paged_bench.native.guard``: what ``make install`` builds) and, with ``--interpreted``, also from
its source (``PAGED_BENCH_INTERPRETED=1``), the two commands alternating, and prints their
ratio. Run from the repository root:

    .venv/bin/python benchmarks/sim_speed.py                 # all cases
    .venv/bin/python benchmarks/sim_speed.py --cases poisson20k --repeats 3 --interpreted

Wall-clock figures on a shared machine are noisy: compare figures printed by the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from paged_bench.native import compile as native_build
from paged_bench.native import guard as native

POISSON_20K = ("workload=poisson", "max_batch=32", "workload.rate=14", "workload.num_requests=20000")
CASES: dict[str, tuple[tuple[str, ...], str | None]] = {
    # name: (overrides, the override that cuts the run to 50 requests; None = report whole-process)
    "seed": ((), None),
    "poisson20k": (POISSON_20K, "workload.num_requests=50"),
    "azure_conv": (("workload=azure_conv",), "workload.limit=50"),
}
TARGET_STEPS_PER_S = 40_000  # issue 11


class Run(NamedTuple):
    wall: float  # seconds
    steps: int  # rows of steps.csv
    system: float  # seconds the kernel worked for it
    faults: int  # minor page faults


def run_once(overrides: tuple[str, ...], interpreted: bool) -> Run:
    """One command, as a user runs it."""
    env = {**os.environ, native.INTERPRETED_ENV: "1" if interpreted else "0"}
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "paged_bench", "backend=sim", *overrides, "tracking.enabled=false",
               f"hydra.run.dir={d}/run"]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed: {proc.stderr.strip().splitlines()[-1:]}")
        with open(Path(d) / "run" / "steps.csv") as f:
            steps = sum(1 for _ in f) - 1  # less the header
    return Run(wall, steps, after.ru_stime - before.ru_stime, after.ru_minflt - before.ru_minflt)


Runs = dict[tuple[bool, str], list[Run]]  # (interpreted, which command): one per repeat


def measure(commands: dict[str, tuple[str, ...]], repeats: int, modes: tuple[bool, ...]) -> Runs:
    """Every command in every mode (interpreted or not), ``repeats`` times, all of them in turn
    each time: a machine that slows down mid-way slows them all."""
    runs: Runs = {(mode, which): [] for mode in modes for which in commands}
    for _ in range(repeats):
        for mode in modes:
            for which, overrides in commands.items():
                runs[mode, which].append(run_once(overrides, mode))
    return runs


def pair_rates(full: list[Run], cut: list[Run]) -> list[float]:
    """Steps per second of each (full, cut) pair of runs: start-up cancelled."""
    return [(f.steps - c.steps) / (f.wall - c.wall) for f, c in zip(full, cut)]


def median_beyond(full: list[Run], cut: list[Run], field: str) -> float:
    """The median over pairs of what the full run took beyond its twin, of ``field``."""
    return statistics.median(getattr(f, field) - getattr(c, field) for f, c in zip(full, cut))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated: {', '.join(CASES)}")
    p.add_argument("--repeats", type=int, default=3, help="runs per command (median wall time)")
    p.add_argument("--interpreted", action="store_true", help="also run each case with the core interpreted")
    args = p.parse_args(argv)
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"--cases: unknown {unknown[0]!r}; one of {', '.join(CASES)}")
    if not native_build.up_to_date():
        print(f"note: the compiled core is missing or stale ({native.stale() or 'not built'}): every run below is "
              "interpreted; make install compiles it\n")  # fmt: skip
    modes = (False, True) if args.interpreted else (False,)
    print("| case | core | steps | wall (s) | 50-request wall (s) | steps/s (start-up cancelled) | pairs' range | "
          "page faults beyond the 50 | system s beyond the 50 |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for name in names:
        overrides, cut = CASES[name]
        commands = {"full": overrides} if cut is None else {"full": overrides, "cut": (*overrides, cut)}
        runs = measure(commands, args.repeats, modes)
        rates = {}
        for mode in modes:
            core = "interpreted" if mode else "compiled"
            full = runs[mode, "full"]
            wall, steps = statistics.median(r.wall for r in full), full[0].steps
            if cut is None:
                rates[mode] = wall
                print(f"| {name} | {core} | {steps:,} | {wall:.2f} | | n/a: {wall:.2f} s is the whole process | | | |")
                continue
            cuts = runs[mode, "cut"]
            pairs = pair_rates(full, cuts)
            rates[mode] = statistics.median(pairs)
            cut_wall = statistics.median(r.wall for r in cuts)
            print(f"| {name} | {core} | {steps:,} | {wall:.2f} | {cut_wall:.2f} | {rates[mode]:,.0f} | "
                  f"{min(pairs):,.0f}-{max(pairs):,.0f} | {median_beyond(full, cuts, 'faults'):,.0f} | "
                  f"{median_beyond(full, cuts, 'system'):.2f} |")  # fmt: skip
        if args.interpreted:
            faster = rates[True] / rates[False] if cut is None else rates[False] / rates[True]
            ratios.append(f"{name} {faster:.2f}x" + (" (whole process)" if cut is None else ""))
    if ratios:
        print(f"\ncompiled core against interpreted, same run: {', '.join(ratios)}")
    print(f"\nissue 11's goal: >= {TARGET_STEPS_PER_S:,} steps/s on poisson20k (python -m paged_bench backend=sim "
          f"{' '.join(POISSON_20K)} tracking.enabled=false); seed under 1 s whole. Medians of {args.repeats} runs "
          "(of pairs, where start-up is cancelled) on this machine, as loaded as it is now.")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
