"""CPU seconds per plan simulation, and the share of it spent building the workload's requests:
a few of the worked question's candidates (``+plan/experiment=llama70b_azure_10x``) at a few
scales, each simulated as a plan's job does (``capacity.trial.simulate``) in this one process.

    python benchmarks/plan_trial_cpu.py            # one line per simulation, then the mean
"""

from __future__ import annotations

import time

from hydra import compose, initialize_config_module

from paged_bench.capacity import trial
from paged_bench.capacity.launch import run_config
from paged_bench.capacity.slo import Slo
from paged_bench.cluster import cluster_bench
from paged_bench.run import bench

CASES = [  # (candidate overrides, scale): small ones failing early, bigger ones running longer
    (["backend.hardware=h100", "backend.tensor_parallel_size=4", "cluster.replicas=1"], 10),
    (["backend.hardware=h100", "backend.tensor_parallel_size=4", "cluster.replicas=1"], 2.5),
    (["backend.hardware=h200", "backend.tensor_parallel_size=8", "cluster.replicas=2"], 10),
    (["backend.hardware=h100", "backend.tensor_parallel_size=4", "cluster.replicas=4"], 3),
    (
        [
            "backend.hardware=h100",
            "backend.tensor_parallel_size=4",
            "cluster.prefill_replicas=2",
            "cluster.decode_replicas=2",
        ],
        5,
    ),
]


def main() -> None:
    built = []
    original = bench.workload_requests

    def timed(*args, **kwargs):  # the requests' share of a simulation
        t = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            built.append(time.process_time() - t)

    bench.workload_requests = cluster_bench.workload_requests = timed
    total = total_build = 0.0
    with initialize_config_module("paged_bench.conf", version_base=None):
        for overrides, scale in CASES:
            cfg = compose(
                "plan",
                [
                    "+plan/experiment=llama70b_azure_10x",
                    "backend.cost_model=roofline",
                    "max_num_batched_tokens=512",
                    *overrides,
                    f"workload.time_scale={1 / scale:.6g}",
                ],
            )
            slo = Slo.from_config(dict(cfg.plan.slo))
            built.clear()
            record = trial.simulate(run_config(cfg), slo)
            b = sum(built)
            total += record["cpu_s"]
            total_build += b
            print(
                f"{' '.join(overrides):90s} x{scale:<5g} passed={record['passed']!s:5s} "
                f"cpu {record['cpu_s']:6.2f} s (requests {b:5.2f} s) {record['stopped_early'] or ''}",
                flush=True,
            )
    n = len(CASES)
    print(f"mean over {n}: {total / n:.2f} CPU-s per simulation, {total_build / n:.2f} of it building requests")


if __name__ == "__main__":
    main()
