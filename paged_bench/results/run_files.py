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
import orjson

from paged_bench.core.engine import STEP_COLUMNS, EngineResult, StepRecords
from paged_bench.results.metrics import request_latencies
from paged_bench.results.records import RequestRecords
from paged_bench.results.whole_files import opened_whole, write_whole

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


# The cells are made as text here, a column at a time, and the rows joined by hand, not by
# csv.writer: writing a big run's files one value at a time through csv.writer, repr'ing each
# float and formatting each int, would be a large share of the whole run (docs/engine.md, speed).


def _needs_quotes(text: str) -> bool:
    """Whether csv.writer (QUOTE_MINIMAL) quotes ``text``: four substring scans, done in C."""
    return "," in text or '"' in text or "\r" in text or "\n" in text


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if _needs_quotes(text) else text


# str(i) for every i below its length: most int cells are small counts, whose text is looked up
# for less than formatting it costs
_numerals: list[str] = []
_NUMERALS_MAX = 1 << 16  # 3.5 MB of text at most


def _int_texts(values: np.ndarray) -> list[str]:
    global _numerals
    cells = values.tolist()
    if not cells:
        return []
    known, top = _numerals, int(values.max())
    # (grown by no more numerals than the column has cells: never more work than formatting it)
    if values.min() >= 0 and top < min(len(known) + len(cells), _NUMERALS_MAX):
        if top >= len(known):  # a longer table, never one grown in place: another thread may be reading it
            known = _numerals = known + list(map(repr, range(len(known), top + 1)))
        return list(map(known.__getitem__, cells))
    return list(map(repr, cells))


def _float_texts(values: np.ndarray) -> list[str]:
    """``repr`` of each value (as csv.writer writes a float), "" for nan (unknown). orjson
    writes repr's digits (the shortest that read back as the value) for a fraction of repr's
    cost, the largest of writing the files; below 1e-4 its text differs (0.00001 and 1e-7, not
    1e-05 and 1e-07), so those, with nan and inf (orjson's null), are repr'd."""
    if not len(values):
        return []
    values = np.ascontiguousarray(values, dtype=np.float64)
    texts = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY).decode()[1:-1].split(",")
    alike = ((np.abs(values) >= 1e-4) & np.isfinite(values)) | (values == 0)
    for at in np.flatnonzero(~alike).tolist():
        value = float(values[at])
        texts[at] = "" if math.isnan(value) else repr(value)
    return texts


def column_texts(values: np.ndarray | list) -> list[str]:
    """A column's cells as csv.writer (QUOTE_MINIMAL) writes them: unknown (nan, None) empty,
    text quoted where it holds a comma, quote or line break."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        return _int_texts(values) if values.dtype.kind in "iu" else _float_texts(values)
    if isinstance(values, np.ndarray):
        values = values.tolist()
    kinds = set(map(type, values))
    if kinds == {str}:
        # text that needs no quotes (a digest, a finish reason): one search, not one a cell
        return values if not _needs_quotes("".join(values)) else list(map(_quoted, values))
    if kinds == {int}:
        return _int_texts(np.array(values))
    return ["" if v is None else _quoted(v) if isinstance(v, str) else str(v) for v in values]


def request_columns(records: RequestRecords) -> tuple[np.ndarray | list, ...]:
    """``requests.csv``'s columns, in ``REQUEST_COLUMNS`` order."""
    lat = request_latencies(records)
    return (
        records.request_id, records.arrival_time, records.first_scheduled_time, records.first_chunk_time,
        records.finish_time, records.prompt_tokens, records.output_tokens, records.max_tokens, records.cached_tokens,
        lat.ttft_ms, lat.tpot_ms, lat.e2el_ms, lat.queue_ms, records.num_preemptions, records.finish_reason,
        records.error, records.output_digest, records.text_digest,
    )  # fmt: skip


# rows made and written a slice at a time: a big run's cells and text are never all held at
# once (memory the kernel would have to fault in first)
_SLICE_ROWS = 4096


Row = tuple[str, ...]  # a CSV row's cells, as text


def _rows(columns: list | tuple) -> Iterator[Row]:
    """A table's rows from its columns, made a slice at a time."""
    for at in range(0, len(columns[0]), _SLICE_ROWS):
        yield from zip(*(column_texts(column[at : at + _SLICE_ROWS]) for column in columns))


def request_rows(records: RequestRecords) -> Iterator[Row]:
    """``requests.csv``'s rows."""
    return _rows(request_columns(records))


def step_rows(steps: StepRecords) -> Iterator[Row]:
    """``steps.csv``'s rows, in ``STEP_COLUMNS`` order."""
    return _rows([steps.column(name) for name in STEP_COLUMNS])


def _write_csv(path: Path, columns: tuple[str, ...], rows: Iterable[Row]) -> None:
    """What csv.writer writes, from rows of ready cells, joined."""
    rows = iter(rows)
    with opened_whole(path, newline="") as f:
        f.write(",".join(columns) + "\r\n")
        while lines := list(map(",".join, islice(rows, _SLICE_ROWS))):
            lines.append("")  # the last row's line break
            f.write("\r\n".join(lines))


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
    _write_csv(paths[1], *(request_table or (REQUEST_COLUMNS, request_rows(records))))
    _write_csv(paths[2], *(step_table or (STEP_COLUMNS, step_rows(result.steps))))
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
    ("swapped blocks (out + in)", ("swapped_blocks",), "{}"),
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
