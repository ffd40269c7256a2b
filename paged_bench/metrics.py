"""Per-request and per-step records -> the summary figures, named as vLLM's benchmark client.

Latencies are in milliseconds: TTFT (arrival to first token), TPOT ((E2EL - TTFT) /
(output tokens - 1), per request), ITL (every gap between consecutive tokens, pooled),
E2EL (arrival to last token), queue time (arrival to first scheduled). Throughputs count
completed requests over the run's duration. KV figures come from the per-step records:
``kv_utilization_mean`` is the time-weighted mean of live / reserved slots,
``kv_waste_pct`` the share of the reservation peak that the live peak does not fill (the
seeds' "74% of the KV cache is air"). Percentile figures are null when there is no sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from paged_bench.engine import EngineResult
from paged_bench.request import Request

PERCENTILES = {"mean": None, "median": 50, "p90": 90, "p95": 95, "p99": 99}
LATENCIES = ("ttft", "tpot", "itl", "e2el", "queue")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


@dataclass(frozen=True, slots=True)
class RequestLatency:
    ttft_ms: float | None
    tpot_ms: float | None
    e2el_ms: float | None
    queue_ms: float | None
    itl_ms: list[float]


def request_latency(req: Request) -> RequestLatency:
    times, t0 = req.token_times, req.arrival_time
    ttft = (times[0] - t0) * 1e3 if times else None
    e2el = (req.finish_time - t0) * 1e3 if times and req.finish_time is not None else None
    n = len(times)
    tpot = (e2el - ttft) / (n - 1) if e2el is not None and ttft is not None and n > 1 else None
    queue = (req.first_scheduled_time - t0) * 1e3 if req.first_scheduled_time is not None else None
    itl = [(b - a) * 1e3 for a, b in zip(times, times[1:])]
    return RequestLatency(ttft, tpot, e2el, queue, itl)


def _stats(name: str, values: list[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    arr = np.asarray(values, dtype=float)
    for label, q in PERCENTILES.items():
        if not len(arr):
            out[f"{label}_{name}_ms"] = None
        else:
            out[f"{label}_{name}_ms"] = float(arr.mean() if q is None else np.percentile(arr, q))
    return out


def summarize(result: EngineResult, slo: Mapping[str, float | None] | None = None) -> dict[str, float | int | None]:
    """The run's summary figures (the keys of ``summary.json``)."""
    done = [r for r in result.requests if r.finish_reason is not None and r.finish_reason.succeeded]
    lat = [request_latency(r) for r in done]
    duration = result.duration
    input_tokens = sum(r.num_prompt_tokens for r in done)
    output_tokens = sum(r.num_output_tokens for r in done)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)

    summary: dict[str, float | int | None] = {
        "completed": len(done),
        "failed": len(result.requests) - len(done),
        "duration": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(output_tokens),
        "total_token_throughput": per_s(input_tokens + output_tokens),
    }
    slo = {k: v for k, v in (slo or {}).items() if v is not None}
    if slo:
        good = sum(all((getattr(x, k) or 0.0) <= v for k, v in slo.items()) for x in lat)
        summary["goodput"] = per_s(good)
    for name in LATENCIES:
        if name == "itl":
            values = [v for x in lat for v in x.itl_ms]
        else:
            values = [v for x in lat if (v := getattr(x, f"{name}_ms")) is not None]
        summary.update(_stats(name, values))
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
