"""A finished cluster run on disk: the engine run's files (``summary.json``, ``requests.csv``,
``steps.csv``, ``run_info.json``) with a ``replica`` column in both tables, and
``replicas.csv``, one summary row per replica. In a disaggregated run ``replica`` is the
decode replica (where a request's last token came from, or its prefill replica if it ended
there), beside ``prefill_replica``, ``kv_transfer_ms`` and ``decode_ttft_ms`` (the TTFT a
P/D proxy's client reads: see ``summary.decode_ttft_ms``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from paged_bench.cluster.loop import ClusterRun
from paged_bench.cluster.summary import decode_ttft_ms
from paged_bench.core.engine import STEP_COLUMNS, EngineResult
from paged_bench.results.records import RequestRecords
from paged_bench.results.run_files import REQUEST_COLUMNS, _write_csv, column_texts, request_rows, step_rows, write_run


def _request_table(run: ClusterRun, records: RequestRecords) -> tuple[tuple[str, ...], Iterable[tuple]]:
    reqs, placement = run.requests, run.placement
    extra: dict[str, list | np.ndarray] = {"replica": [placement.get(r) for r in reqs]}
    if run.prefill_placement:
        transfer_ms = {t.request: t.seconds * 1e3 for t in run.transfers}
        extra["prefill_replica"] = [run.prefill_placement.get(r) for r in reqs]
        extra["kv_transfer_ms"] = [transfer_ms.get(r) for r in reqs]
        extra["decode_ttft_ms"] = decode_ttft_ms(records)
    added = zip(*map(column_texts, extra.values()))
    return (*REQUEST_COLUMNS, *extra), (row + more for row, more in zip(request_rows(records), added))


def write_cluster_run(
    run_dir: Path,
    run: ClusterRun,
    merged: EngineResult,
    records: RequestRecords,
    summary: Mapping[str, Any],
    replicas: list[dict[str, Any]],
    info: Mapping[str, Any],
) -> list[Path]:
    steps = [(str(rep.index), *row) for rep, res in zip(run.replicas, run.results) for row in step_rows(res.steps)]
    time = np.concatenate([res.steps.column("time") for res in run.results]) if run.results else np.zeros(0)
    steps = [steps[i] for i in np.argsort(time, kind="stable").tolist()]  # by time, then replica
    paths = write_run(run_dir, merged, summary, info, records, request_table=_request_table(run, records),
                      step_table=(("replica", *STEP_COLUMNS), steps))  # fmt: skip
    columns = tuple(dict.fromkeys(key for s in replicas for key in s))
    _write_csv(run_dir / "replicas.csv", columns, zip(*(column_texts([s.get(k) for s in replicas]) for k in columns)))
    return [*paths, run_dir / "replicas.csv"]
