"""Can a laptop simulate a 4-replica cluster serving the whole Azure conversation trace?

Replays the Azure LLM inference trace (conversation, November 2023: 19,366 requests over ~58
minutes; ``workload=azure_conv``) with arrivals scaled 4x (four times the rate:
``time_scale=0.25``) on 4 replicas of llama-3-8b on simulated H100s (roofline) behind a
router, and prints the wall time and replica-steps per second. The anchor, measured in the
same process: the plain engine (one replica, ``Engine.run``) on the same trace at its own
rate, so the ratio of steps/s shows what the cluster's event loop costs per step. Run from
the repository root:

    .venv/bin/python benchmarks/cluster_azure.py
    .venv/bin/python benchmarks/cluster_azure.py --router power_of_two --limit 5000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job

SHAPE = ("backend.cost_model=roofline", "backend.model=llama-3-8b", "backend.hardware=h100", "max_batch=128",
         "max_model_len=8192", "max_num_batched_tokens=8192", "tracking.enabled=false")  # fmt: skip


def timed(overrides: list[str]) -> tuple[float, dict, int]:
    """Wall seconds of the whole job (build, run, files), its summary, its replica-steps."""
    with tempfile.TemporaryDirectory() as d:
        cfg = compose_config(*overrides)
        start = time.perf_counter()
        outcome = run_job(cfg, Path(d))
        wall = time.perf_counter() - start
    assert outcome.status == "finished", outcome.error
    return wall, outcome.summary, len(outcome.result.steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--speedup", type=float, default=4.0, help="arrival rate multiplier (4 = time_scale 0.25)")
    p.add_argument("--router", default="least_outstanding")
    p.add_argument("--limit", type=int, default=None, help="first N requests only")
    args = p.parse_args()
    workload = ["workload=azure_conv", *([f"workload.limit={args.limit}"] if args.limit else [])]
    anchor = timed([*workload, *SHAPE])
    cluster = timed([*workload, f"workload.time_scale={1 / args.speedup}", *SHAPE,
                     f"cluster.replicas={args.replicas}", f"router={args.router}"])  # fmt: skip
    rows = [
        ("plain engine, 1 replica, 1x arrivals", *anchor),
        (f"cluster, {args.replicas} replicas ({args.router}), {args.speedup:g}x arrivals", *cluster),
    ]
    for label, wall, s, steps in rows:
        print(f"{label}: {s['completed']} done / {s['failed']} failed, simulated {s['duration']:,.0f} s, "
              f"wall {wall:,.1f} s, {steps:,} replica-steps = {steps / wall:,.0f} replica-steps/s, "
              f"TTFT p50/p99 {s['median_ttft_ms']:,.0f}/{s['p99_ttft_ms']:,.0f} ms")  # fmt: skip
    rate = [steps / wall for _, wall, _, steps in rows]
    print(f"cluster / engine replica-steps/s: {rate[1] / rate[0]:.2f}")


if __name__ == "__main__":
    main()
