"""What MLflow tracking costs a command: tracked vs untracked wall time, side by side.

    .venv/bin/python benchmarks/tracking_cost.py [--repeats 5] [--sweep-jobs 10]

Runs ``python -m paged_bench`` (the default sim run) alternately with ``tracking.enabled=false``
and tracked, in a scratch folder with its own SQLite store, and prints median wall times and
ratios: a tracked single run with the tracking helper already running (warm: every command
after the first), a tracked run that must start the helper first (cold: the first command;
forced by giving each its own helper), and a sweep's tracking cost per job (a tracked minus an
untracked sweep of ``--sweep-jobs`` jobs, divided by the jobs). Figures from a shared machine
are noisy; the ratios are measured in the same run, interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "HYDRA_"))}
    env.update(extra)
    return env


def timed(cwd: Path, *args: str, **env: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "paged_bench", *args], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, check=False)  # fmt: skip
    elapsed = time.perf_counter() - start
    if proc.returncode != 0 or "warning" in proc.stderr:
        raise SystemExit(f"python -m paged_bench {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sweep-jobs", type=int, default=10, help="jobs of the sweep (static,continuous x max_batch)")
    args = parser.parse_args()
    batches = ",".join(str(2 ** (i + 1)) for i in range(max(1, args.sweep_jobs // 2)))
    sweep = ["-m", "scheduler=static,continuous", f"max_batch={batches}"]
    jobs = 2 * len(batches.split(","))
    with tempfile.TemporaryDirectory(prefix="pb-tracking-cost-") as tmp:
        cwd = Path(tmp)
        timed(cwd)  # creates the store (migrations) and starts the helper: not measured
        times: dict[str, list[float]] = {"untracked": [], "warm": [], "cold": [], "sweep_off": [], "sweep_on": []}
        for i in range(args.repeats):
            times["untracked"].append(timed(cwd, "tracking.enabled=false"))
            times["warm"].append(timed(cwd))
            # a helper of its own (its key includes MLFLOW_* settings), gone 2 s after the run
            times["cold"].append(timed(cwd, MLFLOW_BENCHMARK_NONCE=f"{os.getpid()}-{i}", PAGED_BENCH_TRACKING_IDLE_S="2"))
            times["sweep_off"].append(timed(cwd, *sweep, "tracking.enabled=false"))
            times["sweep_on"].append(timed(cwd, *sweep))
    med = {k: statistics.median(v) for k, v in times.items()}
    per_job = (med["sweep_on"] - med["sweep_off"]) / jobs
    rows = [
        ("single run, untracked", med["untracked"], "1.00x"),
        ("single run, tracked (helper running)", med["warm"], f"{med['warm'] / med['untracked']:.2f}x"),
        ("single run, tracked (helper started first)", med["cold"], f"{med['cold'] / med['untracked']:.2f}x"),
        (f"sweep of {jobs} jobs, untracked", med["sweep_off"], "1.00x"),
        (f"sweep of {jobs} jobs, tracked", med["sweep_on"], f"{med['sweep_on'] / med['sweep_off']:.2f}x"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"median of {args.repeats}, default sim run (seed workload), interleaved\n")
    print(f"| {'command':<{width}} | wall (s) | vs untracked |")
    print(f"|{'-' * (width + 2)}|---------:|-------------:|")
    for name, seconds, ratio in rows:
        print(f"| {name:<{width}} | {seconds:8.2f} | {ratio:>12} |")
    print(f"\nsweep tracking per job: {per_job:.3f} s ((tracked - untracked) / {jobs} jobs)")


if __name__ == "__main__":
    main()
