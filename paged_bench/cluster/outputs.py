"""A finished cluster run on disk: the engine run's files (``summary.json``, ``requests.csv``,
``steps.csv``, ``run_info.json``) with a ``replica`` column in both tables, and
``replicas.csv``, one summary row per replica. In a disaggregated run ``replica`` is the
decode replica (where a request's last token came from, or its prefill replica if it ended
there), beside ``prefill_replica``, ``kv_transfer_ms`` and ``decode_ttft_ms`` (the TTFT a
P/D proxy's client reads: see ``summary.decode_ttft_ms``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from paged_bench.cluster.loop import ClusterRun
from paged_bench.cluster.summary import decode_ttft_ms
from paged_bench.engine import STEP_COLUMNS, EngineResult
from paged_bench.outputs import REQUEST_COLUMNS, _write_csv, request_rows, step_rows, write_run
from paged_bench.records import RequestRecords


def _cell(value: Any) -> str:
    """A cell as csv.writer writes it: None empty, a number as ``%s`` writes it."""
    return "" if value is None else str(value)


def _request_table(run: ClusterRun, records: RequestRecords) -> tuple[tuple[str, ...], Iterable[tuple]]:
    rows, reqs, placement = request_rows(records), run.requests, run.placement
    if not run.prefill_placement:
        return (*REQUEST_COLUMNS, "replica"), ((*row, _cell(placement.get(r))) for row, r in zip(rows, reqs))
    transfer_ms = {t.request: t.seconds * 1e3 for t in run.transfers}
    prefill = run.prefill_placement
    decode_ttft = [None if math.isnan(v) else v for v in decode_ttft_ms(records).tolist()]
    columns = (*REQUEST_COLUMNS, "replica", "prefill_replica", "kv_transfer_ms", "decode_ttft_ms")
    return columns, ((*row, _cell(placement.get(r)), _cell(prefill.get(r)), _cell(transfer_ms.get(r)), _cell(d))
                     for row, r, d in zip(rows, reqs, decode_ttft))  # fmt: skip


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
    _write_csv(run_dir / "replicas.csv", columns, [tuple(_cell(s.get(k)) for k in columns) for s in replicas])
    return [*paths, run_dir / "replicas.csv"]
