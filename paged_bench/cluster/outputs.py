"""A finished cluster run on disk: the engine run's files (``summary.json``, ``requests.csv``,
``steps.csv``, ``run_info.json``) with a ``replica`` column in both tables, and
``replicas.csv``, one summary row per replica. In a disaggregated run ``replica`` is the
decode replica (where a request's last token came from, or its prefill replica if it ended
there), beside ``prefill_replica`` and ``kv_transfer_ms``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paged_bench.cluster.loop import ClusterRun
from paged_bench.engine import STEP_COLUMNS, EngineResult
from paged_bench.outputs import REQUEST_COLUMNS, _write_csv, request_rows, write_run


def _request_table(run: ClusterRun, merged: EngineResult) -> tuple[tuple[str, ...], list[tuple]]:
    placement = run.placement
    rows = request_rows(merged)
    if not run.prefill_placement:
        return (*REQUEST_COLUMNS, "replica"), [(*row, placement.get(r)) for row, r in zip(rows, merged.requests)]
    transfer_ms = {t.request: t.seconds * 1e3 for t in run.transfers}
    prefill = run.prefill_placement
    return (*REQUEST_COLUMNS, "replica", "prefill_replica", "kv_transfer_ms"), [
        (*row, placement.get(r), prefill.get(r), transfer_ms.get(r)) for row, r in zip(rows, merged.requests)
    ]


def write_cluster_run(
    run_dir: Path,
    run: ClusterRun,
    merged: EngineResult,
    summary: Mapping[str, Any],
    replicas: list[dict[str, Any]],
    info: Mapping[str, Any],
) -> list[Path]:
    paths = write_run(run_dir, merged, summary, info)
    _write_csv(run_dir / "requests.csv", *_request_table(run, merged))
    steps = sorted(((rep.index, *row) for rep, res in zip(run.replicas, run.results) for row in res.steps),
                   key=lambda row: row[2])  # fmt: skip  (by time, then replica: sorted() is stable)
    _write_csv(run_dir / "steps.csv", ("replica", *STEP_COLUMNS), steps)
    columns = list(dict.fromkeys(key for s in replicas for key in s))
    _write_csv(run_dir / "replicas.csv", tuple(columns), [[s.get(k) for k in columns] for s in replicas])
    return [*paths, run_dir / "replicas.csv"]
