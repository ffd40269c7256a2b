"""A cluster run's figures: the client's view of the whole cluster, plus each replica's.

The cluster's summary is the engine summary over every request (latencies as the client
sees them, throughput over the cluster's duration), with per-replica step records pooled:
so its KV figures are per replica (the largest peak any replica reached, the time-weighted
mean over all replicas' steps, one replica's capacity), and ``cluster_kv_*`` are all replicas'
together (peaks summed at each moment, capacities summed). The prefix-cache hit rate counts
the replicas that prefill (a decode replica takes prompts it never looks up). Added: the replica count, total
replica-steps, load balance (``replica_load_imbalance`` = most requests on one replica /
mean, over the replicas arrivals are routed to; ``decode_load_imbalance`` the same over a
split cluster's decode replicas), the K/V transfers of a disaggregated run, and per-replica
figures ``replica{i}/{figure}`` (the full per-replica summaries go to ``replicas.csv``).

A replica's summary counts the work done there, over the cluster's duration, so that its
counts and throughputs add up to the cluster's. In a split cluster that is part of each
request: a prefill replica prefills prompts and samples first tokens (its ``prefilled``,
input tokens, TTFT and queue time), a decode replica samples the rest (its output tokens
exclude the first one, its input tokens are 0: the prompt's K/V came over the link). Each
request is ``completed`` (or ``failed``) on the replica that produced its last token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from paged_bench.cluster.loop import ClusterRun
from paged_bench.cluster.replica import Replica
from paged_bench.core.engine import STEP_COLUMNS, EngineResult, StepRecords
from paged_bench.results.metrics import (
    LATENCIES,
    PERCENTILES,
    SPREADS,
    latency_stats,
    peak_output_tokens_per_s,
    request_figures,
    summarize,
)  # fmt: skip
from paged_bench.results.records import RequestRecords
from paged_bench.results.step_series import SUMMED_COLUMNS, summed_over_replicas

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
    """One summary per replica, over the requests it ran and the cluster's ``duration``, with
    its role, step count and how busy it was (share of the cluster's duration spent in steps)."""
    out = []
    for replica, res in zip(run.replicas, run.results):
        s: dict[str, Any] = {"replica": replica.index, "role": replica.role, "steps": len(res.steps)}
        busy = float(res.steps.column("duration").sum())
        s["busy_fraction"] = busy / duration if duration > 0 else 0.0
        s.update(summarize(replace(res, duration=duration), slo))
        if replica.role != "colocated":
            s.update(_split_share(run, replica, res, s))
        out.append(s)
    return out


def _latency_keys(*names: str) -> dict[str, None]:
    return {f"{label}_{name}_ms": None for name in names for label in (*PERCENTILES, *SPREADS)}


def _split_share(run: ClusterRun, replica: Replica, res: EngineResult, s: dict[str, Any]) -> dict[str, Any]:
    """A split replica's figures for its part of each request (see the module's docstring);
    ``s`` is the summary of the requests it ran: prefill copies, or handed-over requests. The
    requests' latencies of the other part, and goodput (met by two replicas together), are
    null here: the cluster's summary has them."""
    duration = s["duration"]
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    unmet = {"goodput": None} if "goodput" in s else {}
    if replica.role == "prefill":
        # ended here: its one token was its last (max_tokens 1, an EOS), or it never got one
        ended = [r for r in run.requests if run.placement.get(r, run.prefill_placement.get(r)) == replica.index]
        completed = sum(r.finish_reason is not None and r.finish_reason.succeeded for r in ended)
        return {"prefilled": s["completed"], "completed": completed, "failed": len(ended) - completed,
                "request_throughput": per_s(completed), **unmet,
                **_latency_keys(*(n for n in LATENCIES if n not in ("ttft", "queue")))}  # fmt: skip
    output_tokens = s["total_output_tokens"] - s["completed"]  # each one's first token came from a prefill
    records = RequestRecords.from_requests(res.requests)
    return {"prefilled": 0, "total_input_tokens": 0, "total_output_tokens": output_tokens,
            "output_throughput": per_s(output_tokens), "total_token_throughput": per_s(output_tokens),
            **unmet, "max_output_tokens_per_s": peak_output_tokens_per_s(_without_first_tokens(records),
                                                                                records.succeeded),
            "max_concurrent_requests": None, "prefix_cache_hit_rate": None,  # it looks no prompt up
            **_latency_keys("ttft", "queue")}  # fmt: skip


def _without_first_tokens(records: RequestRecords, least: int = 1) -> RequestRecords:
    """``records`` less the first chunk of each request that has at least ``least`` (a decode
    replica's requests: sampled elsewhere), and its token."""
    counts = records.num_chunks
    dropped = counts >= least
    keep = np.ones(len(records.chunk_times), bool)
    keep[records.chunk_offsets[:-1][dropped & (counts > 0)]] = False
    offsets = np.zeros_like(records.chunk_offsets)
    np.cumsum(counts - (dropped & (counts > 0)), out=offsets[1:])
    tokens = np.where(dropped, np.maximum(records.output_tokens - 1, 0), records.output_tokens)
    return replace(records, chunk_times=records.chunk_times[keep], chunk_offsets=offsets, output_tokens=tokens)


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
    summary["replica_load_imbalance"] = _imbalance(served)
    summary.update(_cluster_kv_peaks(run))
    # kv_capacity_* (capacity_figures) are one replica's pool, as kv_*_peak are one replica's
    summary["cluster_kv_capacity_blocks"] = sum(res.layout.num_blocks for res in run.results)
    summary["cluster_kv_capacity_tokens"] = sum(res.layout.num_slots for res in run.results)
    if summary["num_prefill_replicas"]:
        summary["decode_load_imbalance"] = _imbalance([len(res.requests) for res, role in zip(run.results, roles)
                                                       if role == "decode"])  # fmt: skip
        seconds = [t.seconds * 1e3 for t in run.transfers]
        summary["kv_transfer_bytes"] = sum(t.num_bytes for t in run.transfers)
        summary["num_kv_transfers"] = len(run.transfers)
        summary["mean_kv_transfer_ms"] = float(np.mean(seconds)) if seconds else None
        summary["p99_kv_transfer_ms"] = float(np.percentile(seconds, 99)) if seconds else None
        summary.update(latency_stats("decode_ttft", _decode_ttfts_ms(records)))
        if "goodput" in summary:
            summary["decode_goodput"] = _proxy_goodput(records, merged.duration, slo or {})
    for s in replicas:
        for key in ("busy_fraction", *PER_REPLICA):
            summary[f"replica{s['replica']}/{key}"] = s.get(key)
    return summary, replicas


def _cluster_kv_peaks(run: ClusterRun) -> dict[str, int | None]:
    """The most KV slots the replicas held at once, summed (``kv_*_slots_peak`` are the largest
    one replica held: a sweep over ``cluster.replicas`` showed them fall as replicas were added)."""
    steps = [res.steps for res in run.results]
    if not any(len(s) for s in steps):
        return {"cluster_kv_live_slots_peak": None, "cluster_kv_reserved_slots_peak": None}
    replica = np.concatenate([np.full(len(s), i) for i, s in enumerate(steps)])
    columns = {name: np.concatenate([s.column(name) for s in steps]) for name in (*SUMMED_COLUMNS, "time")}
    _, summed = summed_over_replicas(replica, columns["time"], columns)
    return {f"cluster_{name}_peak": int(summed[name].max()) for name in ("kv_live_slots", "kv_reserved_slots")}


def decode_ttft_ms(records: RequestRecords) -> np.ndarray:
    """A split cluster's TTFT as a client of a P/D proxy reads it: vLLM's
    (``disagg_prefill_proxy_server.py``) discards the prefill instance's token and streams the
    decode instance's, so the client waits for the hand-over and a decode slot too. Per request,
    arrival to the first token a decode replica sampled (its second); nan where it had none."""
    out = np.full(len(records), np.nan)
    has = records.num_chunks >= 2
    out[has] = (records.chunk_times[records.chunk_offsets[:-1][has] + 1] - records.arrival_time[has]) * 1e3
    return out


def _decode_ttfts_ms(records: RequestRecords) -> np.ndarray:
    """``decode_ttft_ms`` of the requests that succeeded and had a decode token."""
    values = decode_ttft_ms(records)[records.succeeded]
    return values[~np.isnan(values)]


def _proxy_goodput(records: RequestRecords, duration: float, slo: Mapping[str, float | None]) -> float | None:
    """Goodput as a P/D proxy's client meets the SLO: it sees the decode replica's tokens alone
    (its TTFT is ``decode_ttft_ms``, its TPOT and E2EL over the tokens after that)."""
    # a request that ended at its prefill (one token) is seen with it: there is no other
    return request_figures(_without_first_tokens(records, least=2), duration, slo).get("goodput")


def _imbalance(counts: list[int]) -> float | None:
    """Most requests on one replica / the mean (1.0 is even); None when none ran any."""
    return float(max(counts) / np.mean(counts)) if sum(counts) else None
