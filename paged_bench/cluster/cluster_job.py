"""One cluster job, start to finish: config -> replicas behind a router -> run -> files.

``run.job.run_job`` hands a config here when its ``cluster`` section asks for more than one
replica; the outcome has the shape of a single engine's (``JobOutcome``), so the command
line, sweeps and MLflow treat a cluster run like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from paged_bench.cluster.cluster_bench import ClusterBench, build_cluster
from paged_bench.cluster.loop import ClusterRun
from paged_bench.cluster.outputs import write_cluster_run
from paged_bench.cluster.spec import ClusterSpec
from paged_bench.cluster.summary import cluster_summary, merged_result
from paged_bench.errors import check
from paged_bench.results.records import RequestRecords
from paged_bench.run.frontend import FrontendSettings
from paged_bench.run.outcome import JobOutcome, ProgressCallback, capacity_figures, run_info, step_callback


def run_cluster_job(
    cfg: Mapping[str, Any],
    run_dir: Path,
    spec: ClusterSpec,
    on_progress: ProgressCallback | None = None,
    options: Mapping[str, str] | None = None,
    shield: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> JobOutcome:
    """As ``run.job.run_job``: what the run measured is summarized and written inside ``shield()``;
    ``options`` label its plugins in ``run_info.json``."""
    target = (cfg.get("target") or {}).get("name", "engine")
    check(target == "engine", "target", target,
          "target=engine for a cluster (cluster.replicas > 1 simulates the replicas in-process)")  # fmt: skip
    FrontendSettings.from_config(cfg.get("frontend")).refuse_priced(
        "frontend=none for a cluster (a priced front end is applied to one in-process engine)"
    )
    bench = build_cluster(cfg, spec)
    try:
        run = bench.cluster.run(bench.requests, step_callback(on_progress, len(bench.requests)))
    finally:
        for replica in bench.cluster.replicas:
            replica.engine.backend.close()
    with shield():
        return _write_outcome(cfg, run_dir, spec, bench, run, options)


def _write_outcome(
    cfg: Mapping[str, Any],
    run_dir: Path,
    spec: ClusterSpec,
    bench: ClusterBench,
    run: ClusterRun,
    options: Mapping[str, str] | None,
) -> JobOutcome:
    merged = merged_result(run)
    records = RequestRecords.from_requests(merged.requests)
    summary, replicas = cluster_summary(run, merged, records, cfg.get("slo"))
    summary.update(capacity_figures(merged.layout, bench.num_gpus, summary.get("output_throughput")))
    outcome = JobOutcome(run_dir, summary, merged, bench.choices, [], records)
    info = run_info(outcome, "engine", bench.kv_budget, options)
    info["cluster"] = {
        "replicas": spec.num_replicas,
        "prefill_replicas": spec.num_prefill,
        "decode_replicas": spec.num_decode if spec.disaggregated else 0,
        "link": vars(spec.link) if spec.disaggregated else None,
    }
    outcome.files = write_cluster_run(run_dir, run, merged, records, summary, replicas, info)
    return outcome
