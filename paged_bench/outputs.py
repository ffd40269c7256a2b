"""A finished run on disk: ``summary.json``, ``requests.csv``, ``steps.csv``, ``run_info.json``,
and the short summary table printed at the end of a run. Each file is written whole
(``files.opened_whole``): a write that fails (a full disk) leaves no file cut short that would
pass for a complete one."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from paged_bench.engine import STEP_COLUMNS, EngineResult, StepRecords
from paged_bench.files import opened_whole, write_whole
from paged_bench.metrics import request_latencies
from paged_bench.records import RequestRecords

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
    "output_digest",
    "text_digest",
)


def _needs_quotes(text: str) -> bool:
    """Whether csv.writer (QUOTE_MINIMAL) quotes ``text``: four scans in C (a regex of the four
    characters was 15x slower, and a run's files hold 80,000 such cells)."""
    return "," in text or '"' in text or "\r" in text or "\n" in text


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if _needs_quotes(text) else text


def _cells(values: np.ndarray | list, texts: Mapping[float, str] | None = None) -> list:
    """A column as csv.writer (QUOTE_MINIMAL) writes its cells: unknown (nan, None) empty, text
    quoted where it holds a comma, quote or line break; a float found in ``texts`` as its text."""
    if isinstance(values, np.ndarray):
        cells = values.tolist()
        if texts:
            cells = list(map(texts.get, cells, cells))  # its text, else the value
        return ["" if v != v else v for v in cells] if values.dtype.kind == "f" and np.isnan(values).any() else cells
    if set(map(type, values)) == {str} and not _needs_quotes("".join(values)):
        return values  # text that needs no quotes (a digest, a finish reason): one search, not one a cell
    return ["" if v is None else _quoted(v) if isinstance(v, str) else v for v in values]


def clock_texts(times: list[float]) -> dict[float, str]:
    """The step clock's times as CSV text (``repr``, as ``%s`` writes a float). Formatting floats
    is most of writing a run's files, and requests.csv's times taken at a step's end (first
    scheduled, first token, finish) repeat steps.csv's: each is formatted once, here."""
    return dict(zip(times, map(repr, times)))


def request_columns(records: RequestRecords) -> tuple[np.ndarray | list, ...]:
    """``requests.csv``'s columns, in ``REQUEST_COLUMNS`` order."""
    lat = request_latencies(records)
    return (
        records.request_id, records.arrival_time, records.first_scheduled_time, records.first_chunk_time,
        records.finish_time, records.prompt_tokens, records.output_tokens, records.max_tokens, records.cached_tokens,
        lat.ttft_ms, lat.tpot_ms, lat.e2el_ms, lat.queue_ms, records.num_preemptions, records.finish_reason,
        records.error, records.output_digest, records.text_digest,
    )  # fmt: skip


_CLOCK_COLUMNS = frozenset(("first_scheduled_time", "first_token_time", "finish_time"))  # a step's end, or an arrival


# rows made and written a slice at a time: a big run's cells and text are never all held at
# once (memory the kernel would fault in first: 5,500 page faults of the 20,000-request run)
_SLICE_ROWS = 4096


def request_rows(records: RequestRecords, clock: Mapping[float, str] | None = None) -> Iterator[tuple]:
    """``requests.csv``'s rows; ``clock``: ``clock_texts`` of the run's step times."""
    columns = request_columns(records)
    texts = [clock if name in _CLOCK_COLUMNS else None for name in REQUEST_COLUMNS]
    for at in range(0, len(records), _SLICE_ROWS):
        yield from zip(*(_cells(v[at : at + _SLICE_ROWS], t) for v, t in zip(columns, texts)))


def step_rows(steps: StepRecords, clock: Mapping[float, str] | None = None) -> Iterator[tuple]:
    """``steps.csv``'s rows, in ``STEP_COLUMNS`` order (numbers; ``time`` as text when given
    its ``clock_texts``)."""
    columns = [steps.column(name) for name in STEP_COLUMNS]
    at_time = STEP_COLUMNS.index("time")
    for at in range(0, len(steps), _SLICE_ROWS):
        cells = [column[at : at + _SLICE_ROWS].tolist() for column in columns]
        if clock:
            cells[at_time] = list(map(clock.get, cells[at_time], cells[at_time]))
        yield from zip(*cells)


def _write_csv(path: Path, columns: tuple[str, ...], rows: Iterable[tuple]) -> None:
    """What csv.writer writes, formatted a row at a time by one %-format (rows hold ready cells)."""
    row = ",".join(["%s"] * len(columns)) + "\r\n"
    rows = iter(rows)
    with opened_whole(path, newline="") as f:
        f.write(",".join(columns) + "\r\n")
        while text := "".join(map(row.__mod__, islice(rows, _SLICE_ROWS))):
            f.write(text)


def write_steps(run_dir: Path, steps: StepRecords) -> Path:
    """``steps.csv`` alone: what the engine measured, whatever else fails."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "steps.csv"
    _write_csv(path, STEP_COLUMNS, step_rows(steps))
    return path


Table = tuple[tuple[str, ...], Iterable[tuple]]  # a CSV file's columns and rows


def write_run(
    run_dir: Path,
    result: EngineResult,
    summary: Mapping[str, Any],
    info: Mapping[str, Any],
    records: RequestRecords | None = None,
    *,
    request_table: Table | None = None,
    step_table: Table | None = None,
) -> list[Path]:
    """Write the run's files into ``run_dir``; returns their paths. ``records`` are the run's
    requests when they are not the engine's (an HTTP run's); the tables replace the engine's
    ``requests.csv`` and ``steps.csv`` (a cluster's add a replica column)."""
    if records is None:
        records = RequestRecords.from_requests(result.requests)
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = [run_dir / n for n in ("summary.json", "requests.csv", "steps.csv", "run_info.json")]
    write_whole(paths[0], json.dumps(dict(summary), indent=2) + "\n")
    clock = clock_texts(result.steps.column("time").tolist()) if step_table is None else None
    _write_csv(paths[1], *(request_table or (REQUEST_COLUMNS, request_rows(records, clock))))
    _write_csv(paths[2], *(step_table or (STEP_COLUMNS, step_rows(result.steps, clock))))
    write_whole(paths[3], json.dumps(dict(info), indent=2, default=str) + "\n")
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
    ("GPUs, output tok/s per GPU", ("num_gpus", "output_throughput_per_gpu"), "{}, {:.1f}"),
    # a cluster's (a row shows where its figures are in the summary)
    ("replicas, load imbalance (max / mean)", ("num_replicas", "replica_load_imbalance"), "{}, {:.2f}"),
    ("decode replicas' load imbalance (max / mean)", ("decode_load_imbalance",), "{:.2f}"),
    ("KV live / reserved peak, all replicas (slots)", ("cluster_kv_live_slots_peak", "cluster_kv_reserved_slots_peak"),
     "{} / {}"),
    ("TTFT via a P/D proxy median / p99 (ms)", ("median_decode_ttft_ms", "p99_decode_ttft_ms"), "{:.1f} / {:.1f}"),
    ("goodput via a P/D proxy (req/s)", ("decode_goodput",), "{:.2f}"),
    ("K/V transfer mean (ms)", ("mean_kv_transfer_ms",), "{:.2f}"),
)


# what the engine's rows mean in a cluster's summary (docs/cluster.md)
_CLUSTER_LABELS = {
    "KV live / reserved peak (slots)": "KV live / reserved peak, largest replica (slots)",
    "replicas, load imbalance (max / mean)": "replicas, load imbalance of those routed to (max / mean)",
}


def format_summary(summary: Mapping[str, Any], title: str = "") -> str:
    """A short two-column table of the headline figures."""
    lines = []
    for label, keys, fmt in _TABLE:
        if "num_replicas" in summary:
            label = _CLUSTER_LABELS.get(label, label)
        values = [summary.get(k) for k in keys]
        if any(k not in summary for k in keys):
            continue
        bad = any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values)
        lines.append((label, "n/a" if bad else fmt.format(*values)))
    width = max(len(label) for label, _ in lines)
    body = "\n".join(f"  {label:<{width}}  {value}" for label, value in lines)
    return f"{title}\n{body}" if title else body
