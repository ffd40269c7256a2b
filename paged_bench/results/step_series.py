"""A cluster's step records as one series: each replica counts its own steps, and what the
replicas hold at once (running requests, KV slots) adds up. Reports, MLflow's step-wise
metrics and the cluster's summary read a cluster's steps through these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# what a cluster's replicas hold at once adds up; a replica that ran out of work holds none
SUMMED_COLUMNS = ("batch_size", "running", "waiting", "kv_live_slots", "kv_reserved_slots")


def summed_over_replicas(replica: np.ndarray, time: np.ndarray,
                         columns: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
    """A cluster's step records (row i is replica ``replica[i]``'s step ending at ``time[i]``;
    ``columns`` holds ``SUMMED_COLUMNS``) as one series: the rows' order by time, and per column,
    at the end of each of those steps, its figure plus every other replica's latest (none once
    that replica went idle)."""
    order = np.lexsort((np.arange(len(time)), time))  # by time, then as given
    ids = np.asarray(replica)[order]
    by_replica = np.lexsort((np.arange(len(ids)), ids))  # each replica's rows, in time order
    previous = np.full(len(ids), -1)  # the same replica's previous row, by position in ``order``
    same = ids[by_replica][1:] == ids[by_replica][:-1]
    previous[by_replica[1:][same]] = by_replica[:-1][same]
    idle = np.asarray(columns["running"], float)[order] <= 0
    summed = {}
    for name in SUMMED_COLUMNS:
        value = np.asarray(columns[name], float)[order]
        standing = np.where(idle, 0.0, value)  # its share of the total until its next step
        before = np.where(previous >= 0, standing[np.maximum(previous, 0)], 0.0)
        summed[name] = np.cumsum(standing - before) - standing + value
    return order, summed


def cluster_columns(replica: np.ndarray, columns: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A cluster's step records (``columns``: ``time``, ``preemptions`` and ``SUMMED_COLUMNS``,
    row i replica ``replica[i]``'s) as one engine's: ``step`` counting the rows in time order,
    ``time``, ``duration`` 0 (each value holds until the next row), the ``summed_over_replicas``
    figures and each row's ``preemptions``."""
    time = np.asarray(columns["time"], float)
    order, summed = summed_over_replicas(replica, time, columns)
    return {"step": np.arange(len(order)), "time": time[order], "duration": np.zeros(len(order)), **summed,
            "preemptions": np.asarray(columns["preemptions"], float)[order]}  # fmt: skip


def cluster_wide(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """``cluster_columns`` of ``steps.csv`` rows (its ``replica`` column says whose: each replica
    counts its own steps), as rows. A run of one engine's rows (no ``replica`` column) is
    returned as it is."""
    if not rows or "replica" not in rows[0]:
        return [dict(row) for row in rows]
    columns = {name: [float(row[name]) for row in rows] for name in (*SUMMED_COLUMNS, "time", "preemptions")}
    merged = {k: v.tolist() for k, v in cluster_columns(np.array([str(row["replica"]) for row in rows]), columns).items()}
    return [dict(zip(merged, values)) for values in zip(*merged.values())]
