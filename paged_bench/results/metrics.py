"""Per-request and per-step records -> the summary figures, named and defined as vLLM's
benchmark client (``vllm bench serve``) defines them; docs/metrics.md compares them, one by one,
with vLLM's and guidellm's.

Latencies are in milliseconds, per request: TTFT (arrival, or sending over HTTP, to the first
chunk), TPOT ((E2EL - TTFT) / (output tokens - 1), requests of 2+ tokens), ITL (every gap
between consecutive chunks, pooled), E2EL (to the last chunk that carried content), queue time
(arrival to first scheduled; engine runs only). Each has mean, median, p90/p95/p99 and std
(population, as ``np.std``); a figure with no sample is null. Only successful requests count.
Throughputs and goodput divide by the run's duration: the end of the last step in-process, the
return of the last request (failed ones included) over HTTP. ``max_output_tokens_per_s`` is
the most chunks that arrived within one 1-second bucket from the first request's start (one
chunk per token in-process), ``max_concurrent_requests`` the peak of successful requests
between start and last chunk (half-open intervals).

KV figures come from the per-step records: ``kv_utilization_mean`` is the time-weighted mean
of live / reserved slots, ``kv_waste_pct`` the share of the reservation peak that the live
peak does not fill (the seeds' "74% of the KV cache is air").

Everything is computed on columns (numpy), never per request in Python: a 20,000-request run
costs milliseconds here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from paged_bench.core.engine import EngineResult
from paged_bench.core.request import Request
from paged_bench.results.records import RequestRecords

PERCENTILES = {"mean": None, "median": 50, "p90": 90, "p95": 95, "p99": 99}
SPREADS = ("std",)  # reported beside the percentiles, for every latency
LATENCIES = ("ttft", "tpot", "itl", "e2el", "queue")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


@dataclass(frozen=True)
class Latencies:
    """Per-request latencies in ms, one entry per record (nan where undefined)."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2el_ms: np.ndarray
    queue_ms: np.ndarray


def request_latencies(records: RequestRecords) -> Latencies:
    t0 = records.arrival_time
    ttft = (records.first_chunk_time - t0) * 1e3
    e2el = (records.last_chunk_time - t0) * 1e3
    n = records.output_tokens
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(n > 1, (e2el - ttft) / (n - 1), np.nan)
    queue = (records.first_scheduled_time - t0) * 1e3
    return Latencies(ttft, tpot, e2el, queue)


@dataclass(frozen=True, slots=True)
class RequestLatency:
    ttft_ms: float | None
    tpot_ms: float | None
    e2el_ms: float | None
    queue_ms: float | None
    itl_ms: list[float]


def request_latency(req: Request) -> RequestLatency:
    """One request's latencies (the server's live histograms); same definitions as the summary."""
    records = RequestRecords.from_requests([req])
    lat = request_latencies(records)
    values = [None if np.isnan(v[0]) else float(v[0]) for v in (lat.ttft_ms, lat.tpot_ms, lat.e2el_ms, lat.queue_ms)]
    return RequestLatency(*values, (records.chunk_gaps(np.ones(1, bool)) * 1e3).tolist())


def latency_stats(name: str, values: np.ndarray) -> dict[str, float | None]:
    """``name``'s percentiles, mean and std (ms) over ``values``; null when there are none."""
    if not len(values):
        return dict.fromkeys([f"{label}_{name}_ms" for label in (*PERCENTILES, *SPREADS)])
    ranks = [q for q in PERCENTILES.values() if q is not None]
    at = dict(zip(ranks, np.percentile(values, ranks).tolist()))  # one partial sort for all ranks
    out = {f"{label}_{name}_ms": float(values.mean()) if q is None else at[q] for label, q in PERCENTILES.items()}
    out[f"std_{name}_ms"] = float(values.std())
    return out


def peak_output_tokens_per_s(records: RequestRecords, done: np.ndarray) -> float:
    """vLLM's ``max_output_tokens_per_s``: chunks counted in 1 s buckets from the earliest start."""
    if not done.any():
        return 0.0
    seconds = records.chunk_times_of(done)  # a copy, worked in place: a big run's is 10 MB
    seconds -= records.arrival_time[done].min()
    np.floor(seconds, out=seconds)
    if not len(seconds):
        return 0.0
    if seconds.max() <= 4 * len(seconds):  # a counter per second of the run: the fast way
        return float(np.bincount(seconds.astype(np.int64)).max())
    # a simulated run can span far more seconds than it has chunks (a rate of 1e-9 req/s):
    # count only the seconds that hold chunks
    return float(np.unique(seconds, return_counts=True)[1].max())


def peak_concurrency(starts: np.ndarray, ends: np.ndarray) -> int:
    """vLLM's ``max_concurrent_requests``: the most intervals [start, end) open at one instant
    (an end and a start at the same instant do not overlap)."""
    if not len(starts):
        return 0
    starts, ends = np.sort(starts), np.sort(ends)
    open_after = np.searchsorted(starts, starts, "right") - np.searchsorted(ends, starts, "right")
    return int(max(open_after.max(), 0))


def request_figures(
    records: RequestRecords, duration: float, slo: Mapping[str, float | None] | None = None
) -> dict[str, float | int | None]:
    """The request-level figures of an engine or HTTP run."""
    done = records.succeeded
    lat = request_latencies(records)
    input_tokens = int(records.prompt_tokens[done].sum())
    output_tokens = int(records.output_tokens[done].sum())
    completed = int(done.sum())
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)

    summary: dict[str, float | int | None] = {
        "completed": completed,
        "failed": len(records) - completed,
        "duration": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": per_s(completed),
        "output_throughput": per_s(output_tokens),
        "total_token_throughput": per_s(input_tokens + output_tokens),
    }
    slo = {k: v for k, v in (slo or {}).items() if v is not None}
    if slo:
        good = np.ones(completed, bool)
        for key, limit in slo.items():  # an undefined latency (TPOT of 1 token) counts as 0, as in vLLM
            good &= np.nan_to_num(getattr(lat, key)[done], nan=0.0) <= limit
        summary["goodput"] = per_s(int(good.sum()))
    for name in LATENCIES:
        if name == "itl":
            values = records.chunk_gaps(done)
            values *= 1e3
        else:
            values = getattr(lat, f"{name}_ms")[done]
            values = values[~np.isnan(values)]
        summary.update(latency_stats(name, values))
    summary["max_output_tokens_per_s"] = peak_output_tokens_per_s(records, done)
    starts, ends = records.arrival_time[done], records.last_chunk_time[done]
    summary["max_concurrent_requests"] = peak_concurrency(starts, np.where(np.isnan(ends), starts, ends))
    return summary


def summarize(
    result: EngineResult, slo: Mapping[str, float | None] | None = None, records: RequestRecords | None = None
) -> dict[str, float | int | None]:
    """The run's summary figures (the keys of ``summary.json``); ``records`` are the run's
    requests when they are not the engine's (an HTTP run's)."""
    if records is None:
        records = RequestRecords.from_requests(result.requests)
    summary = request_figures(records, result.duration, slo)
    summary.update(_kv_figures(result))
    summary["num_preemptions"] = result.num_preemptions
    summary["recomputed_tokens"] = result.recomputed_tokens
    summary["swapped_blocks"] = result.swapped_blocks
    queries = result.prefix_query_tokens
    summary["prefix_cache_hit_rate"] = result.prefix_hit_tokens / queries if queries else 0.0
    summary["preempted_prefix_hit_tokens"] = result.preempted_prefix_hit_tokens
    return summary


def _kv_figures(result: EngineResult) -> dict[str, float | int | None]:
    steps = result.steps
    live = steps.column("kv_live_slots").astype(float)
    reserved = steps.column("kv_reserved_slots").astype(float)
    dt = steps.column("duration")
    live_peak = int(live.max()) if len(live) else 0
    reserved_peak = int(reserved.max()) if len(reserved) else 0
    held = (reserved > 0) & (dt > 0)
    util = float(np.average(live[held] / reserved[held], weights=dt[held])) if held.any() else None
    waste = None
    if reserved_peak:
        # live and reserved at the same step: where the reservation peaks (the fullest such step)
        live_at_peak = live[reserved == reserved_peak].max()
        waste = 100.0 * (1 - live_at_peak / reserved_peak)
    out: dict[str, float | int | None] = {
        "kv_live_slots_peak": live_peak,
        "kv_reserved_slots_peak": reserved_peak,
        "kv_utilization_mean": util,
        "kv_waste_pct": waste,
    }
    if result.kv_bytes_per_token is not None:
        out["kv_bytes_per_token"] = result.kv_bytes_per_token
        out["kv_reserved_bytes_peak"] = reserved_peak * result.kv_bytes_per_token
    return out
