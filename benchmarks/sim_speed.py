"""Whole-run simulator speed: engine steps per second of wall time, as a user runs the command.

Each case runs ``python -m paged_bench ... backend=sim tracking.enabled=false`` as a subprocess
(imports, Hydra, workload build, the step loop, metrics and every output file included) and
counts the rows of its ``steps.csv``. Start-up is cancelled by running the same command cut to
50 requests and taking the difference:

    steps/s = (steps - steps_50) / (wall - wall_50)       (medians over --repeats runs)

The seed workload has only 48 requests, so it is reported as whole-process seconds (issue 11:
under 1 s untracked) and steps over that time. Run from the repository root:

    .venv/bin/python benchmarks/sim_speed.py                 # all cases
    .venv/bin/python benchmarks/sim_speed.py --cases poisson20k --repeats 3

Wall-clock figures on a shared machine are noisy: compare figures printed by the same run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POISSON_20K = ("workload=poisson", "max_batch=32", "workload.rate=14", "workload.num_requests=20000")
CASES: dict[str, tuple[tuple[str, ...], str | None]] = {
    # name: (overrides, the override that cuts the run to 50 requests; None = report whole-process)
    "seed": ((), None),
    "poisson20k": (POISSON_20K, "workload.num_requests=50"),
    "azure_conv": (("workload=azure_conv",), "workload.limit=50"),
}
TARGET_STEPS_PER_S = 40_000  # issue 11


def run_once(overrides: tuple[str, ...]) -> tuple[float, int]:
    """(wall seconds, rows of steps.csv) of one command."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "paged_bench", "backend=sim", *overrides, "tracking.enabled=false",
               f"hydra.run.dir={d}/run"]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed: {proc.stderr.strip().splitlines()[-1:]}")
        with open(Path(d) / "run" / "steps.csv") as f:
            return wall, sum(1 for _ in f) - 1  # less the header


def measure(overrides: tuple[str, ...], repeats: int) -> tuple[float, int]:
    runs = [run_once(overrides) for _ in range(repeats)]
    return statistics.median(w for w, _ in runs), runs[0][1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated: {', '.join(CASES)}")
    p.add_argument("--repeats", type=int, default=3, help="runs per command (median wall time)")
    args = p.parse_args(argv)
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"--cases: unknown {unknown[0]!r}; one of {', '.join(CASES)}")
    print("| case | steps | wall (s) | 50-request wall (s) | steps/s (start-up cancelled) |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        overrides, cut = CASES[name]
        wall, steps = measure(overrides, args.repeats)
        if cut is None:
            print(f"| {name} | {steps:,} | {wall:.2f} | | n/a: {wall:.2f} s is the whole process |")
            continue
        base_wall, base_steps = measure((*overrides, cut), args.repeats)
        rate = (steps - base_steps) / (wall - base_wall)
        print(f"| {name} | {steps:,} | {wall:.2f} | {base_wall:.2f} | {rate:,.0f} |")
    print(f"\nissue 11's goal: >= {TARGET_STEPS_PER_S:,} steps/s on poisson20k (python -m paged_bench backend=sim "
          f"{' '.join(POISSON_20K)} tracking.enabled=false); seed under 1 s whole. Medians of {args.repeats} runs "
          "on this machine, as loaded as it is now.")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
