"""A cluster run's figures: the client's view of the whole cluster, plus each replica's.

The cluster's summary is the engine summary over every request (latencies as the client
sees them, throughput over the cluster's duration), with per-replica step records pooled:
so its KV figures are per replica (the largest peak any replica reached, the time-weighted
mean over all replicas' steps). The prefix-cache hit rate counts the replicas that prefill
(a decode replica takes prompts it never looks up). Added: the replica count, total
replica-steps, load balance (``replica_load_imbalance`` = most requests on one replica /
mean), the K/V transfers of a disaggregated run, and per-replica figures
``replica{i}/{figure}`` (the full per-replica summaries go to ``replicas.csv``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from paged_bench.cluster.loop import ClusterRun
from paged_bench.engine import STEP_COLUMNS, EngineResult, StepRecords
from paged_bench.metrics import summarize
from paged_bench.records import RequestRecords

PER_REPLICA = ("completed", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "prefix_cache_hit_rate",
               "num_preemptions", "kv_reserved_slots_peak")  # fmt: skip


def merged_result(run: ClusterRun) -> EngineResult:
    """The cluster as one engine result: every request, every replica's steps in time order
    (numbered anew in that order; ``steps.csv`` keeps each replica's own numbers)."""
    results = run.results
    prefilling = [res for res, rep in zip(results, run.replicas) if rep.role != "decode"]
    columns = {name: np.concatenate([res.steps.column(name) for res in results]) for name in STEP_COLUMNS}
    order = np.argsort(columns["time"], kind="stable")  # by time, then replica
    columns = {name: column[order] for name, column in columns.items()}
    columns["step"] = np.arange(len(order))  # the cluster's replica-steps, counted in time order
    steps = StepRecords()
    for row in zip(*(columns[name].tolist() for name in STEP_COLUMNS)):
        steps.append(row)
    return EngineResult(
        requests=run.requests,
        steps=steps,
        duration=max(res.duration for res in results),
        layout=results[0].layout,
        kv_bytes_per_token=results[0].kv_bytes_per_token,
        num_preemptions=sum(res.num_preemptions for res in results),
        recomputed_tokens=sum(res.recomputed_tokens for res in results),
        swapped_blocks=sum(res.swapped_blocks for res in results),
        prefix_query_tokens=sum(res.prefix_query_tokens for res in prefilling),
        prefix_hit_tokens=sum(res.prefix_hit_tokens for res in prefilling),
        preempted_prefix_query_tokens=sum(res.preempted_prefix_query_tokens for res in results),
        preempted_prefix_hit_tokens=sum(res.preempted_prefix_hit_tokens for res in results),
        error=run.error,
        interrupted=run.interrupted,
        leaks=[f"replica {i}: {leak}" for i, res in enumerate(results) for leak in res.leaks],
    )


def replica_summaries(run: ClusterRun, duration: float, slo: Mapping[str, float | None] | None) -> list[dict[str, Any]]:
    """One summary per replica, over the requests it ran, with its role, step count and how
    busy it was (share of the cluster's duration spent in steps)."""
    out = []
    for replica, res in zip(run.replicas, run.results):
        s: dict[str, Any] = {"replica": replica.index, "role": replica.role, "steps": len(res.steps)}
        busy = float(res.steps.column("duration").sum())
        s["busy_fraction"] = busy / duration if duration > 0 else 0.0
        s.update(summarize(res, slo))
        out.append(s)
    return out


def cluster_summary(
    run: ClusterRun, merged: EngineResult, records: RequestRecords, slo: Mapping[str, float | None] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The cluster's summary (``summary.json``) and the per-replica ones (``replicas.csv``);
    ``merged`` is ``merged_result(run)``, ``records`` its requests'."""
    summary: dict[str, Any] = summarize(merged, slo, records)
    replicas = replica_summaries(run, merged.duration, slo)
    roles = [r.role for r in run.replicas]
    summary["num_replicas"] = len(roles)
    summary["num_prefill_replicas"] = roles.count("prefill")
    summary["num_decode_replicas"] = roles.count("decode")
    summary["replica_steps"] = len(merged.steps)
    served = [len(res.requests) for res, role in zip(run.results, roles) if role != "decode"]
    summary["replica_load_imbalance"] = float(max(served) / np.mean(served)) if sum(served) else None
    if summary["num_prefill_replicas"]:
        seconds = [t.seconds * 1e3 for t in run.transfers]
        summary["kv_transfer_bytes"] = sum(t.num_bytes for t in run.transfers)
        summary["num_kv_transfers"] = len(run.transfers)
        summary["mean_kv_transfer_ms"] = float(np.mean(seconds)) if seconds else None
        summary["p99_kv_transfer_ms"] = float(np.percentile(seconds, 99)) if seconds else None
    for s in replicas:
        for key in ("busy_fraction", *PER_REPLICA):
            summary[f"replica{s['replica']}/{key}"] = s.get(key)
    return summary, replicas
