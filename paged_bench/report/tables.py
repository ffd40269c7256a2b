"""Comparison tables: every run with its figures (CSV + markdown), and the head-to-head view
that puts the policies side by side with how many times better each is than the baseline
(the first policy of the sweep), one row per metric per setting of the other dimensions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from paged_bench.report.load import Run, RunSet, derived_figures
from paged_bench.run.flat import display_key, display_value


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    better: str | None  # "higher", "lower", or None when neither is better
    fmt: str = "{:,.0f}"


_METRICS = [
    Metric("completed", "completed", "higher", "{}"),
    Metric("failed", "failed", "lower", "{}"),
    Metric("duration", "duration (s)", None, "{:.2f}"),
    Metric("request_throughput", "request throughput (req/s)", "higher", "{:.2f}"),
    Metric("output_throughput", "output throughput (tok/s)", "higher"),
    Metric("total_token_throughput", "total throughput (tok/s)", "higher"),
    Metric("output_throughput_per_gpu", "output throughput per GPU (tok/s)", "higher"),
    Metric("goodput", "goodput (req/s)", "higher", "{:.2f}"),
    *(
        Metric(f"{stat}_{name}_ms", f"{label} {stat.replace('median', 'p50')} (ms)", "lower")
        for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"), ("queue", "queue"))
        for stat in ("mean", "median", "p90", "p95", "p99")
    ),
    Metric("kv_capacity_tokens", "KV capacity (tokens)", "higher"),
    Metric("kv_live_slots_peak", "KV live peak (slots)", None),
    Metric("kv_reserved_slots_peak", "KV reserved peak (slots)", "lower"),
    Metric("kv_reserved_bytes_peak", "KV reserved peak (bytes)", "lower"),
    Metric("kv_utilization_mean", "KV utilisation (mean)", "higher", "{:.0%}"),
    Metric("kv_waste_pct", "KV waste at peak (%)", "lower", "{:.1f}"),
    Metric("block_table_entries_peak", "block-table entries at peak", "lower"),
    Metric("num_preemptions", "preemptions", "lower"),
    Metric("recomputed_tokens", "recomputed tokens", "lower"),
    Metric("swapped_blocks", "swapped blocks", "lower"),
    Metric("prefix_cache_hit_rate", "prefix-cache hit rate", "higher", "{:.0%}"),
    # an HTTP run's, against a server that exports its own TTFT (docs/serving.md)
    Metric("server_mean_ttft_ms", "server TTFT mean (ms)", "lower"),
    Metric("http_ttft_overhead_ms", "HTTP TTFT overhead (ms)", "lower", "{:.1f}"),
    # a cluster's (docs/cluster.md)
    Metric("replica_load_imbalance", "load imbalance (max / mean)", "lower", "{:.2f}"),
    Metric("cluster_kv_reserved_slots_peak", "KV reserved peak, all replicas (slots)", "lower"),
    Metric("cluster_kv_live_slots_peak", "KV live peak, all replicas (slots)", None),
    Metric("cluster_kv_capacity_tokens", "KV capacity, all replicas (tokens)", "higher"),
    Metric("decode_load_imbalance", "decode load imbalance (max / mean)", "lower", "{:.2f}"),
    Metric("kv_transfer_bytes", "K/V transferred (bytes)", None),
    Metric("mean_kv_transfer_ms", "K/V transfer mean (ms)", "lower", "{:.2f}"),
    Metric("p99_kv_transfer_ms", "K/V transfer p99 (ms)", "lower", "{:.2f}"),
    Metric("median_decode_ttft_ms", "TTFT via a P/D proxy p50 (ms)", "lower"),
    Metric("p99_decode_ttft_ms", "TTFT via a P/D proxy p99 (ms)", "lower"),
    Metric("decode_goodput", "goodput via a P/D proxy (req/s)", "higher", "{:.2f}"),
]
METRICS = {m.key: m for m in _METRICS}
DEFAULT_METRICS = ["output_throughput", "median_ttft_ms", "p99_ttft_ms", "p99_e2el_ms", "kv_reserved_slots_peak"]


def metric(key: str) -> Metric:
    return METRICS.get(key) or Metric(key, key, None, "{:.4g}")


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fmt(m: Metric, value: Any) -> str:
    if _missing(value):
        return "n/a"
    try:
        return m.fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def gain(m: Metric, baseline: Any, value: Any) -> str:
    """How many times better ``value`` is than ``baseline`` (a plain ratio when neither way is better)."""
    if _missing(baseline) or _missing(value) or not _number(baseline) or not _number(value):
        return "n/a"
    num, den = (baseline, value) if m.better == "lower" else (value, baseline)
    if den == 0 or num == 0:  # a count that is zero on one side: no "times better" to tell
        return "n/a"
    ratio = num / den
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def figures(run: Run) -> dict[str, Any]:
    return {**run.summary, **derived_figures(run)}


def markdown_table(headers: list[str], rows: list[list[str]], numeric: list[bool] | None = None) -> str:
    numeric = numeric or [False] * len(headers)
    cells = [headers, *rows]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return (
            "| "
            + " | ".join(str(c).rjust(w) if num else str(c).ljust(w) for c, w, num in zip(row, widths, numeric))
            + " |"
        )

    rule = "|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(widths, numeric)) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _cell(value: Any) -> Any:
    """A CSV cell: a boolean as the config spells it (``true``, as swept and as the markdown
    table shows it; pandas would write Python's ``True``), anything else as it is."""
    return display_value(value) if isinstance(value, bool) else value


def comparison_frame(rs: RunSet):
    """Every run with its dimensions, status and all of its figures (the CSV)."""
    import pandas as pd

    rows = []
    for run in rs.runs:
        row: dict[str, Any] = {"job": run.job, "run": rs.label(run)}
        row.update({display_key(k): rs.value(run, k) for k in rs.dims})
        row.update({"status": run.status, "error": run.error or "", "source": run.source})
        row.update(figures(run))
        rows.append({key: _cell(value) for key, value in row.items()})
    return pd.DataFrame(rows)


def comparison_markdown(rs: RunSet, metrics: list[str]) -> str:
    """One row per run: the dimensions that vary, then the chosen metrics."""
    if len(rs.runs) == 1:  # a single run: its figures, one per line
        run = rs.runs[0]
        rows = [[metric(k).label, fmt(metric(k), figures(run).get(k))] for k in metrics if k in figures(run)]
        if rows and run.status != "finished":  # no other row to stand beside: say what its figures are of
            rows.insert(0, ["status", f"{run.status}: the figures below are of the part it ran"])
        return markdown_table(["metric", "value"], rows, [False, True])
    show_status = any(r.status != "finished" for r in rs.runs)
    headers = (
        [display_key(k) for k in rs.dims] + (["status"] if show_status else []) + [metric(k).label for k in metrics]
    )
    rows = []
    for run in rs.runs:
        row = [display_value(rs.value(run, k)) for k in rs.dims] + ([run.status] if show_status else [])
        row += [fmt(metric(k), figures(run).get(k)) for k in metrics]
        rows.append(row)
    numeric = [k in rs.axes for k in rs.dims] + ([False] if show_status else []) + [True] * len(metrics)
    return markdown_table(headers, rows, numeric)


def head_to_head_markdown(rs: RunSet, metrics: list[str]) -> str | None:
    """The policies side by side with each one's gain over the baseline; None when there is
    no policy to compare or nothing to put beside it. A run that did not finish shows its
    status, not the figures of the part it ran; runs of one setting repeated (the same sweep
    twice) are rows of their own, numbered."""
    if rs.policy is None:
        return None
    values = rs.policy_values()
    if len(values) < 2:
        return None
    others = [k for k in rs.dims if k != rs.policy]
    cells: dict[tuple, dict[Any, Run]] = {}
    for run in rs.runs:
        setting, policy = tuple(display_value(rs.value(run, k)) for k in others), rs.value(run, rs.policy)
        repeat = 1
        while policy in cells.get((*setting, repeat), {}):
            repeat += 1
        cells.setdefault((*setting, repeat), {})[policy] = run
    repeated = any(key[-1] > 1 for key in cells)
    base = values[0]
    headers = [display_key(k) for k in others] + (["repeat"] if repeated else []) + ["metric"]
    names = [rs.policy_label(v) for v in values]
    base_value = display_value(base) if rs.policy in rs.axes else names[0]  # tensor_parallel_size=2 vs 1
    headers += names + [f"{name} vs {base_value}" for name in names[1:]]
    rows = []
    for key, by_policy in cells.items():
        finished = {v: r for v, r in by_policy.items() if r.status == "finished" and r.summary}
        for k in metrics:
            m = metric(k)
            got = {v: (figures(finished[v]).get(k) if v in finished else None) for v in values}
            if all(_missing(x) for x in got.values()) and len(finished) == len(by_policy):
                continue
            row = list(key[:-1]) + ([str(key[-1])] if repeated else []) + [m.label]
            row += [fmt(m, got[v]) if v in finished else _status(by_policy.get(v)) for v in values]
            row += [gain(m, got[base], got[v]) for v in values[1:]]
            rows.append(row)
    if not rows:
        return None
    numeric = [k in rs.axes for k in others] + [True] * repeated + [False] + [True] * (2 * len(values) - 1)
    return markdown_table(headers, rows, numeric)


def _status(run: Run | None) -> str:
    return "not run" if run is None else run.status
