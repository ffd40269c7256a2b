"""A finished run on disk: ``summary.json``, ``requests.csv``, ``steps.csv``, ``run_info.json``,
and the short summary table printed at the end of a run."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paged_bench.engine import STEP_COLUMNS, EngineResult
from paged_bench.metrics import request_latency

REQUEST_COLUMNS = (
    "request_id",
    "arrival_time",
    "first_scheduled_time",
    "first_token_time",
    "finish_time",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "cached_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "queue_ms",
    "num_preemptions",
    "finish_reason",
    "error",
)


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


def _write_csv(path: Path, columns: tuple[str, ...], rows: list[tuple]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(("" if v is None else v for v in row) for row in rows)


def write_run(run_dir: Path, result: EngineResult, summary: Mapping[str, Any], info: Mapping[str, Any]) -> list[Path]:
    """Write the run's files into ``run_dir``; returns their paths."""
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = [run_dir / n for n in ("summary.json", "requests.csv", "steps.csv", "run_info.json")]
    paths[0].write_text(json.dumps(dict(summary), indent=2) + "\n")
    _write_csv(paths[1], REQUEST_COLUMNS, request_rows(result))
    _write_csv(paths[2], STEP_COLUMNS, list(result.steps.rows()))
    paths[3].write_text(json.dumps(dict(info), indent=2, default=str) + "\n")
    return paths


_TABLE = (
    ("requests completed / failed", ("completed", "failed"), "{} / {}"),
    ("duration (s)", ("duration",), "{:.2f}"),
    ("output throughput (tok/s)", ("output_throughput",), "{:.1f}"),
    ("TTFT median / p99 (ms)", ("median_ttft_ms", "p99_ttft_ms"), "{:.1f} / {:.1f}"),
    ("TPOT median / p99 (ms)", ("median_tpot_ms", "p99_tpot_ms"), "{:.1f} / {:.1f}"),
    ("ITL median / p99 (ms)", ("median_itl_ms", "p99_itl_ms"), "{:.1f} / {:.1f}"),
    ("E2EL median / p99 (ms)", ("median_e2el_ms", "p99_e2el_ms"), "{:.1f} / {:.1f}"),
    ("KV live / reserved peak (slots)", ("kv_live_slots_peak", "kv_reserved_slots_peak"), "{} / {}"),
    ("KV waste at peak (%)", ("kv_waste_pct",), "{:.1f}"),
    ("preemptions", ("num_preemptions",), "{}"),
    ("prefix cache hit rate", ("prefix_cache_hit_rate",), "{:.1%}"),
    ("goodput (req/s)", ("goodput",), "{:.2f}"),
)


def format_summary(summary: Mapping[str, Any], title: str = "") -> str:
    """A short two-column table of the headline figures."""
    lines = []
    for label, keys, fmt in _TABLE:
        values = [summary.get(k) for k in keys]
        if any(k not in summary for k in keys):
            continue
        bad = any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values)
        lines.append((label, "n/a" if bad else fmt.format(*values)))
    width = max(len(label) for label, _ in lines)
    body = "\n".join(f"  {label:<{width}}  {value}" for label, value in lines)
    return f"{title}\n{body}" if title else body
