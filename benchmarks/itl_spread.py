"""Where each case's median ITL sits in its distribution: numpy run against the simulator.

A median of inter-token gaps is one gap: where few gaps lie near it, a small shift in the mix
of steps (how many run one sequence and how many two) moves it by far more than any step's
cost moves. For each of ``sim_vs_numpy.py``'s cases this runs the numpy backend once (virtual
time, thread CPU timer, as that script runs it) and the simulator once on ``--preset``, and
prints both runs' gap percentiles around the median and the share of gaps within ``NEAR`` (5%)
of the median: the smaller that share, the more the median cell tips.

    .venv/bin/python benchmarks/itl_spread.py --preset runs/calibration/numpy-small.json
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from sim_vs_numpy import NUMPY, SCHEDULERS, WORKLOADS, overrides

from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job

PERCENTILES = (30, 40, 45, 50, 55, 60, 70)
NEAR = 0.05


def itl_gaps_ms(cfg) -> np.ndarray:
    """Every inter-token gap (ms) of one run of ``cfg``, run as ``sim_vs_numpy.run`` runs a case
    and pooled as the summary's ITL pools them (the completed requests')."""
    with tempfile.TemporaryDirectory() as d:
        records = run_job(cfg, Path(d)).records
    return records.chunk_gaps(records.succeeded) * 1e3


def spread_row(label: str, gaps: np.ndarray) -> str:
    median = float(np.median(gaps))
    near = float(np.mean(np.abs(gaps / median - 1) < NEAR))
    cells = " | ".join(f"{np.percentile(gaps, q):.2f}" for q in PERCENTILES)
    return f"| {label} | {len(gaps)} | {cells} | {near:.0%} |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", type=Path, required=True, help="a calibrated preset (sim_vs_numpy.py writes one)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--schedulers", default=",".join(SCHEDULERS))
    args = p.parse_args()
    columns = " | ".join(f"p{q} (ms)" for q in PERCENTILES)
    print(f"| case, backend | gaps | {columns} | within {NEAR:.0%} of the median |")
    print("|---|---:|" + "---:|" * len(PERCENTILES) + "---:|")
    for workload in args.workloads.split(","):
        for scheduler in args.schedulers.split(","):
            case = (*overrides(workload, scheduler), "tracking.enabled=false")
            numpy_gaps = itl_gaps_ms(compose_config(*NUMPY["thread_cpu"], *case))
            sim_gaps = itl_gaps_ms(compose_config("backend=sim", f"backend.preset={args.preset}", *case))
            print(spread_row(f"{workload}/{scheduler}, numpy", numpy_gaps), flush=True)
            print(spread_row(f"{workload}/{scheduler}, sim", sim_gaps), flush=True)


if __name__ == "__main__":
    main()
