"""One cluster job, start to finish: config -> replicas behind a router -> run -> files.

``app.run_job`` hands a config here when its ``cluster`` section asks for more than one
replica; the outcome has the shape of a single engine's (``JobOutcome``), so the command
line, sweeps and MLflow treat a cluster run like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paged_bench.cluster.build import build_cluster
from paged_bench.cluster.outputs import write_cluster_run
from paged_bench.cluster.spec import ClusterSpec
from paged_bench.cluster.summary import cluster_summary, merged_result
from paged_bench.errors import check
from paged_bench.request import Request

if TYPE_CHECKING:
    from paged_bench.app import JobOutcome, ProgressCallback


def run_cluster_job(
    cfg: Mapping[str, Any], run_dir: Path, spec: ClusterSpec, on_progress: ProgressCallback | None = None
) -> JobOutcome:
    from paged_bench.app import JobOutcome, Progress  # app imports this module lazily

    check((cfg.get("target") or {}).get("name", "engine") == "engine", "target", cfg.get("target"),
          "target=engine for a cluster (cluster.replicas > 1 simulates the replicas in-process)")  # fmt: skip
    bench = build_cluster(cfg, spec)
    on_step = None
    if on_progress is not None:
        progress = Progress(total=len(bench.requests))

        def on_step(now: float, finished: list[Request]) -> None:
            if finished:
                progress.advance(now, finished)
                on_progress(progress)

    try:
        run = bench.cluster.run(bench.requests, on_step)
    finally:
        for replica in bench.cluster.replicas:
            replica.engine.backend.close()
    merged = merged_result(run)
    summary, replicas = cluster_summary(run, cfg.get("slo"))
    outcome = JobOutcome(run_dir, summary, merged, bench.choices, [])
    info = {
        "status": outcome.status,
        "error": outcome.error,
        "choices": bench.choices,
        "kv_layout": {
            "num_blocks": merged.layout.num_blocks,
            "block_size": merged.layout.block_size,
            "num_cpu_blocks": merged.layout.num_cpu_blocks,
        },
        "num_requests": len(merged.requests),
        "num_steps": len(merged.steps),
        "target": "engine",
        "cluster": {
            "replicas": spec.num_replicas,
            "prefill_replicas": spec.num_prefill,
            "decode_replicas": spec.num_decode if spec.disaggregated else 0,
            "link": vars(spec.link) if spec.disaggregated else None,
        },
    }
    outcome.files = write_cluster_run(run_dir, run, merged, summary, replicas, info)
    return outcome
