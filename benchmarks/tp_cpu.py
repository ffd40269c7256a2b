"""What tensor parallelism costs on this CPU: backend=torch at TP=1 against TP=2 (two worker
processes over gloo), the same workload and the same cores, in one run.

Three configurations per model: TP=1 on one thread, TP=1 on two threads, TP=2 with one
thread per rank (two cores, as TP=1 on two threads). Reports output tokens/s, median ITL and
the ratios of TP=2 to each TP=1, plus the step's all-reduce count (2 per layer). On a CPU the ranks share one
memory bus, so splitting the weights does not add bandwidth, and every layer pays two gloo
all-reduces through shared memory: expect TP=2 to be slower, the more so the smaller the model.

    .venv/bin/python benchmarks/tp_cpu.py [--threads 2] [--models small,bench-200m] [--requests 8]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from paged_bench.model.config import PRESETS
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job

CONFIGS = ((1, 1), (1, 2), (2, 1))  # (TP, threads per rank)


def run(model: str, tp: int, threads: int, requests: int, new_tokens: int) -> dict:
    overrides = [
        "backend=torch", f"backend.model={model}", "backend.device=cpu", f"backend.tensor_parallel_size={tp}",
        f"backend.threads={threads}", "workload=uniform", f"workload.num_requests={requests}",
        "workload.rate=100000", "workload.prompt_len=64", f"workload.output_len={new_tokens}",
        "tracking.enabled=false",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        outcome = run_job(compose_config(*overrides), Path(d))
    assert outcome.status == "finished", outcome.error
    return outcome.summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="small,bench-200m")
    parser.add_argument("--requests", type=int, default=8, help="concurrent requests (all arrive at once)")
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    print("| model | TP | threads per rank | output tok/s | ITL p50 (ms) | all-reduces per step | TP=2 / this |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for model in args.models.split(","):
        got = {c: run(model, *c, args.requests, args.new_tokens) for c in CONFIGS}
        two = got[(2, 1)]["output_throughput"]
        for (tp, threads), s in got.items():
            ratio = f"{two / s['output_throughput']:.2f}x" if tp == 1 else ""
            print(f"| {model} | {tp} | {threads} | {s['output_throughput']:.1f} | {s['median_itl_ms']:.1f} "
                  f"| {2 * PRESETS[model].num_layers if tp > 1 else 0} | {ratio} |")  # fmt: skip


if __name__ == "__main__":
    main()
