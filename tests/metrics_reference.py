"""The per-request Python metrics and CSV code as it was before the columnar rewrite (commit
35a7a83, paged_bench/results/metrics.py and outputs.py), kept frozen as an oracle: the columnar code
must give the same figures and the same ``requests.csv``/``steps.csv`` content on the same
engine result (tests/test_metrics_identity.py), and benchmarks/metrics_outputs.py times the
two side by side. Not used by the package."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from paged_bench.core.engine import STEP_COLUMNS, EngineResult
from paged_bench.core.request import Request
from paged_bench.results.metrics import RequestLatency  # the same record then and now

PERCENTILES = {"mean": None, "median": 50, "p90": 90, "p95": 95, "p99": 99}
LATENCIES = ("ttft", "tpot", "itl", "e2el", "queue")
OLD_REQUEST_COLUMNS = (
    "request_id", "arrival_time", "first_scheduled_time", "first_token_time", "finish_time", "prompt_tokens",
    "output_tokens", "max_tokens", "cached_tokens", "ttft_ms", "tpot_ms", "e2el_ms", "queue_ms", "num_preemptions",
    "finish_reason", "error",
)  # fmt: skip


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


def request_summary(result: EngineResult, slo: dict | None = None) -> dict[str, float | int | None]:
    """The request-level part of the old ``summarize`` (the KV part is unchanged)."""
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
    return summary


def request_rows(result: EngineResult) -> list[tuple]:
    rows = []
    for r in result.requests:
        lat = request_latency(r)
        rows.append((
            r.request_id, r.arrival_time, r.first_scheduled_time, r.first_token_time, r.finish_time,
            r.num_prompt_tokens, r.num_output_tokens, r.max_tokens, r.num_cached_tokens,
            lat.ttft_ms, lat.tpot_ms, lat.e2el_ms, lat.queue_ms, r.num_preemptions,
            r.finish_reason.value if r.finish_reason else "", r.error or "",
        ))  # fmt: skip
    return rows


def write_csv(path: Path, columns: tuple[str, ...], rows: list[tuple]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(("" if v is None else v for v in row) for row in rows)


def write_tables(run_dir: Path, result: EngineResult) -> None:
    """The old ``requests.csv`` and ``steps.csv``."""
    write_csv(run_dir / "requests.csv", OLD_REQUEST_COLUMNS, request_rows(result))
    write_csv(run_dir / "steps.csv", STEP_COLUMNS, result.steps)
