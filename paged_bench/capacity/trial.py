"""One simulation of a plan: a candidate's run config at one arrival-rate scale, checked
against the SLO, its result kept in its own folder (``trial.json``) so that a plan rerun
reads it instead of simulating again.

The run is the one ``python -m paged_bench`` makes of the same config (``run.bench``'s engine or
``cluster``'s replicas, the summary computed by the same functions), with one difference: a
run that has broken its SLO stops there (``slo.Watch``): what is left cannot change its answer.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paged_bench.capacity.slo import Slo, Watch
from paged_bench.cluster.cluster_bench import build_cluster
from paged_bench.cluster.spec import cluster_spec
from paged_bench.cluster.summary import cluster_summary, merged_result
from paged_bench.results.metrics import summarize
from paged_bench.results.records import RequestRecords
from paged_bench.results.whole_files import write_whole
from paged_bench.run.bench import build
from paged_bench.run.job import run_in_process

TRIAL_FILE = "trial.json"
# the summary figures a trial keeps besides its SLO's (the table's and the costs')
KEPT = ("completed", "failed", "duration", "request_throughput", "output_throughput", "total_output_tokens",
        "p90_ttft_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "num_preemptions")  # fmt: skip


def simulate(cfg: Mapping[str, Any], slo: Slo) -> dict[str, Any]:
    """Run the resolved run config ``cfg``; what it measured and whether it met ``slo``."""
    started = time.process_time()
    # Python's cyclic collector paused while it runs: a run makes next to no reference cycles,
    # and the collector's passes over a trace's ~20K live requests and their records took ~40%
    # of a simulation's CPU time (benchmarks/plan_trial_cpu.py); the cycles it made are freed
    # after, in one pass over the objects it made (all of them young: none was collected)
    paused = gc.isenabled()
    gc.disable()
    try:
        record = _simulate(cfg, slo)
    finally:
        if paused:
            gc.enable()
            gc.collect(0)
    return {**record, "cpu_s": time.process_time() - started}


def _simulate(cfg: Mapping[str, Any], slo: Slo) -> dict[str, Any]:
    spec = cluster_spec(cfg)
    if spec is None:
        bench = build(cfg)
        watch = Watch(slo, bench.requests, bench.engine.scheduler.max_model_len)
        try:
            result = run_in_process(bench, watch.on_step)  # as target=engine runs it (front end included)
        finally:
            bench.backend.close()
        summary = None if watch.broken else summarize(result, bench.config.run.slo)
        error = result.error if not result.interrupted else None
    else:
        cluster = build_cluster(cfg, spec)
        loop = cluster.cluster
        # a replica's step ends after the loop's clock: no token can come before the loop's own time
        watch = Watch(slo, cluster.requests, loop.replicas[0].engine.scheduler.max_model_len, lambda: loop.now)
        try:
            run = loop.run(cluster.requests, watch.on_step)
        finally:
            for replica in loop.replicas:
                replica.engine.backend.close()
        summary = None
        if not watch.broken:
            merged = merged_result(run)
            summary, _ = cluster_summary(run, merged, RequestRecords.from_requests(merged.requests), cfg.get("slo"))
        error = run.error if not run.interrupted else None
    figures = slo.figures(summary) if summary else {}
    missed = [watch.broken.split(":")[0]] if watch.broken else slo.missed(figures)
    return {
        "passed": not missed and error is None,
        "missed": missed,
        "stopped_early": watch.broken,
        "error": error,
        "figures": figures,
        "summary": {key: summary.get(key) for key in KEPT} if summary else {},
    }


def read(folder: Path) -> dict[str, Any] | None:
    """A finished trial's record, or None (never run, or cut off before it was written)."""
    try:
        return json.loads((folder / TRIAL_FILE).read_text())
    except (OSError, ValueError):
        return None


def write(folder: Path, record: Mapping[str, Any]) -> None:
    """Whole or not at all: a trial cut off mid-write is run again, never half read."""
    folder.mkdir(parents=True, exist_ok=True)
    write_whole(folder / TRIAL_FILE, json.dumps(record, indent=1, sort_keys=True))
