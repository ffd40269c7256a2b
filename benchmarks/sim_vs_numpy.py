"""Does the calibrated simulator predict the real numpy backend? The seed workload, both ways.

Calibrates the roofline against ``backend=numpy`` (or takes ``--preset FILE``), then runs the
seed workload on the numpy backend (wall clock, real compute) and on ``backend=sim`` with that
preset (virtual time), for each scheduler, and prints median TTFT and output throughput side
by side with the simulator's relative error (the target: within 15% on the default,
continuous scheduler). Run from the repository root:

    .venv/bin/python benchmarks/sim_vs_numpy.py
    .venv/bin/python benchmarks/sim_vs_numpy.py --preset runs/calibration/numpy-small.json --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from paged_bench.app import run_job
from paged_bench.config import compose_config
from paged_bench.model.calibrate import calibrate, default_shapes
from paged_bench.model.roofline import measure_cpu, save_preset

KEYS = ("median_ttft_ms", "output_throughput")


def measure(overrides: list[str], repeats: int) -> dict[str, float]:
    """Median over ``repeats`` runs of each key (wall-clock runs vary on shared cores)."""
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            runs.append(run_job(compose_config(*overrides, "tracking.enabled=false"), Path(d)).summary)
    return {k: statistics.median(r[k] for r in runs) for k in KEYS}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", type=Path, help="a calibrated preset (default: calibrate now)")
    p.add_argument("--out", type=Path, default=Path("runs/calibration/numpy-small.json"))
    p.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    p.add_argument("--schedulers", default="continuous,static")
    args = p.parse_args()
    preset = args.preset
    if preset is None:
        cfg = compose_config("backend=numpy")
        cost, info = calibrate(cfg, measure_cpu(), default_shapes(cfg["max_model_len"]), repeats=5)
        save_preset(args.out, cost, info)
        preset = args.out
        print(f"calibrated on {info['fit']['samples']} shapes, median |error| {info['fit']['median_abs_rel_err']:.1%}"
              f" -> {preset}")  # fmt: skip
    print("\n| scheduler | backend | median TTFT (ms) | output tok/s |\n|---|---|---|---|")
    for sched in args.schedulers.split(","):
        real = measure(["backend=numpy", "workload=seed", f"scheduler={sched}"], args.repeats)
        sim = measure(["backend=sim", f"backend.preset={preset}", "workload=seed", f"scheduler={sched}"], 1)
        err = {k: sim[k] / real[k] - 1 for k in KEYS}
        print(f"| {sched} | numpy | {real[KEYS[0]]:.1f} | {real[KEYS[1]]:.1f} |")
        print(
            f"| {sched} | sim (preset) | {sim[KEYS[0]]:.1f} ({err[KEYS[0]]:+.1%}) | {sim[KEYS[1]]:.1f} ({err[KEYS[1]]:+.1%}) |"
        )


if __name__ == "__main__":
    main()
