"""Static vs continuous batching on real compute (``backend=numpy``), as docs/backends.md quotes
it: the two commands a user runs, in interleaved pairs so that the machine's drift (which moves
static's wait most) falls on both, then the medians and each pair's cut in median TTFT.

    .venv/bin/python benchmarks/numpy_batching.py [--pairs 3]

Each run is the whole command, ``python -m paged_bench backend=numpy workload=seed
scheduler=<static|continuous> tracking.enabled=false`` (max_batch 16 by default), read back
from its ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCHEDULERS = ("static", "continuous")
COLUMNS = (("median_ttft_ms", "median TTFT", "{:.1f} ms"), ("p99_ttft_ms", "p99 TTFT", "{:.1f} ms"),
           ("output_throughput", "output tok/s", "{:.0f}"), ("median_e2el_ms", "E2EL p50", "{:.0f} ms"))  # fmt: skip


def run(scheduler: str, folder: Path) -> dict[str, float]:
    """One whole command; its summary."""
    cmd = [sys.executable, "-m", "paged_bench", "backend=numpy", "workload=seed", f"scheduler={scheduler}",
           "tracking.enabled=false", f"hydra.run.dir={folder}"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads((folder / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3, help="interleaved static/continuous pairs (median)")
    args = p.parse_args()
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in SCHEDULERS}
    with tempfile.TemporaryDirectory() as d:
        for pair in range(args.pairs):
            for scheduler in SCHEDULERS:
                runs[scheduler].append(run(scheduler, Path(d) / f"{scheduler}{pair}"))
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.pairs} interleaved pairs\n")
    print("| scheduler | " + " | ".join(label for _, label, _ in COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for scheduler in SCHEDULERS:
        cells = [f.format(statistics.median(r[key] for r in runs[scheduler])) for key, _, f in COLUMNS]
        print(f"| {scheduler} | " + " | ".join(cells) + " |")
    cuts = [s["median_ttft_ms"] / c["median_ttft_ms"] for s, c in zip(runs["static"], runs["continuous"])]
    print(f"\nmedian TTFT cut: {statistics.median(cuts):.1f}x (pairs: {', '.join(f'{x:.1f}x' for x in cuts)})")


if __name__ == "__main__":
    main()
