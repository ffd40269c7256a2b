"""Reading a request trace file into columns: arrival times, prompt lengths or texts, output lengths.

A trace is a CSV or JSONL file (optionally gzipped: ``.csv.gz``, ``.jsonl.gz``), one request
per row. Columns are found by name: ``workload.columns`` maps our fields to the file's
names (a null field is not mapped), and otherwise the names other tools write are recognised
(case, spaces and dashes ignored). A column read must be named once: which of two
``timestamp`` columns, or of ``time`` and ``arrival_time``, is meant, nothing says.

- ``arrival_time``: arrival_time, timestamp (Azure ``TIMESTAMP``, BurstGPT ``Timestamp``,
  Mooncake ``timestamp``), time, arrival, relative_timestamp (guidellm)
- ``prompt_len``: prompt_len, input_length (Mooncake), ContextTokens (Azure), Request tokens
  (BurstGPT), prompt_tokens_count and input_tokens_count (guidellm), prompt_tokens, input_tokens,
  input_len
- ``output_len``: output_len, output_length (Mooncake), GeneratedTokens (Azure), Response
  tokens (BurstGPT), output_tokens_count and completion_tokens_count (guidellm), output_tokens,
  completion_tokens, max_tokens
- ``prompt`` (text, tokenized by the engine's tokenizer; or, in JSONL, a list of token ids):
  prompt, text_input (aiperf), text, input

Times are ISO datetimes (``2023-11-16 18:15:46.6805900``, with or without a zone; naive ones
are read as UTC) or numbers in ``time_unit`` (``s``, ``ms``, ``us``; ``auto`` = seconds,
except milliseconds for a Mooncake-style ``timestamp`` + ``input_length`` file). Datetimes and
numbers >= 1e9 s (epoch seconds) are absolute; smaller numbers are seconds from the start. A
file with both is refused: no LLM trace began before 2001 (1e9 epoch seconds) or ran for 31
years (1e9 s of offsets), so a mix is offsets beside epoch seconds, or the wrong ``time_unit``.
So are epoch seconds past 2100: epoch milliseconds read as seconds.

Every problem is one line naming the file and the line: a byte that is not UTF-8, a row the
CSV or JSON parser cannot read, a missing or non-numeric value (or a JSON boolean: ``true`` is
no token count).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from paged_bench.errors import MAX_TOKENS, ConfigError, check

FIELDS = ("arrival_time", "prompt_len", "output_len", "prompt")
ALIASES: dict[str, tuple[str, ...]] = {
    "arrival_time": ("arrival_time", "timestamp", "time", "arrival", "relative_timestamp"),
    "prompt_len": ("prompt_len", "input_length", "contexttokens", "request_tokens", "prompt_tokens_count",
                   "input_tokens_count", "prompt_tokens", "input_tokens", "input_len"),  # fmt: skip
    "output_len": ("output_len", "output_length", "generatedtokens", "response_tokens", "output_tokens_count",
                   "completion_tokens_count", "output_tokens", "completion_tokens", "max_tokens"),  # fmt: skip
    "prompt": ("prompt", "text_input", "text", "input"),
}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
EPOCH_MIN_S = 1e9  # numbers from here on are epoch seconds (2001-09-09 onwards), not offsets
# 2100-01-01: epoch "seconds" past it are milliseconds or microseconds read as seconds (1.7e12
# is 2023 in ms, year 55845 in s), which no datetime can even hold past year 9999
EPOCH_MAX_S = 4102444800.0
SUFFIXES = (".csv", ".jsonl", ".csv.gz", ".jsonl.gz")


@dataclass
class TraceRows:
    """The file's requests as columns, in file order; ``lines[i]`` is row i's line in the file."""

    times: list[float]  # seconds: epoch seconds when ``absolute``, else from the trace's start
    absolute: bool
    prompt_lens: list[int | None]  # as the row states it; None where it gives only a prompt (text or token ids)
    prompts: list[str | list[int] | None]
    output_lens: list[int]
    lines: list[int]
    failed: int = 0  # rows left out: 0 output tokens, requests that failed when recorded (BurstGPT's)


def suffix(path: Path) -> str:
    name = path.name.lower()
    return next((s for s in SUFFIXES if name.endswith(s)), path.suffix)


def _normal(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", str(name).strip().lower())


def _text(path: Path) -> str:
    raw = path.read_bytes()
    if path.name.lower().endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise ConfigError("workload.path", str(path), f"a readable gzip file ({e})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError("workload.path", f"{path}:{line}",
                          f"a UTF-8 text file (byte 0x{raw[e.start]:02x} is not UTF-8)") from None  # fmt: skip


def check_columns(columns: Any) -> dict[str, str]:
    """``workload.columns`` as field -> column name, the null (not mapped) fields left out."""
    check(columns is None or isinstance(columns, Mapping), "workload.columns", columns,
          f"a mapping of field -> column name, the fields among {', '.join(FIELDS)}")  # fmt: skip
    for field, name in (columns or {}).items():
        check(field in FIELDS, f"workload.columns.{field}", name, f"a field among {', '.join(FIELDS)}")
        check(name is None or isinstance(name, str), f"workload.columns.{field}", name,
              "a column name (quoted if it looks like a number), or null to find it by name")  # fmt: skip
    return {field: name for field, name in (columns or {}).items() if name is not None}


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, value in pairs:
        if key in row:  # json.loads would keep the last value, unnoticed
            raise ValueError(f"key {key!r} twice")
        row[key] = value
    return row


def _records(path: Path, text: str) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(line number, row) for every non-empty row."""
    if suffix(path).startswith(".csv"):
        reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
        try:
            for row in reader:
                if None in row:  # more values than the header has names
                    raise ConfigError("workload.path", f"{path}:{reader.line_num}",
                                      f"rows with the header's {len(reader.fieldnames or [])} columns")  # fmt: skip
                yield reader.line_num, row
        except csv.Error as e:
            # the reader counts only the lines of complete records: the bad one starts on the next
            raise ConfigError("workload.path", f"{path}:{reader.line_num + 1}", f"a CSV file ({e})") from None
        return
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line, object_pairs_hook=_unique_keys)
            except ValueError as e:  # JSONDecodeError, or a repeated key
                why = getattr(e, "msg", str(e))
                raise ConfigError("workload.path", f"{path}:{line_no}", f"one JSON object per line ({why})") from None
            check(isinstance(row, dict), "workload.path", f"{path}:{line_no}", "one JSON object per line")
            yield line_no, row


def _header(path: Path, text: str, rows: list[Mapping[str, Any]]) -> list[str]:
    """The column names as the file spells them, repeats kept (a CSV row's dict holds the last);
    a JSON Lines file's are every row's keys (a row may name what the first leaves out)."""
    if suffix(path).startswith(".csv"):
        return next(csv.reader(io.StringIO(text, newline="")))
    return list(dict.fromkeys(key for row in rows for key in row))  # a row with a repeated key was refused


def _find_columns(names: list[str], columns: Mapping[str, str], path: Path) -> dict[str, str | None]:
    """Our field -> the file's column name (None if absent); ``columns`` as ``check_columns`` gives it."""
    for field, name in columns.items():
        check(name in names, f"workload.columns.{field}", name, f"a column of {path} ({', '.join(names)})")
    found: dict[str, str | None] = {}
    for field in FIELDS:
        if field in columns:
            same = [name for name in names if name == columns[field]]
        else:  # every recognised name: of time and arrival_time, which is meant nothing says
            same = [name for name in names if _normal(name) in ALIASES[field]]
        # distinct names can be picked by name; a name written twice can only be renamed
        fix = f"pick one with workload.columns.{field}=COLUMN" if len(set(same)) == len(same) else "rename the others"
        check(len(same) <= 1, "workload.path", str(path),
              f"one column for {field}, not {len(same)} ({', '.join(same)}): {fix}")  # fmt: skip
        found[field] = same[0] if same else None
    missing = [f for f in ("arrival_time", "output_len") if found[f] is None]
    if found["prompt_len"] is None and found["prompt"] is None:
        missing.append("prompt_len or prompt")
    if missing:
        raise ConfigError("workload.path", str(path),
                          f"a trace with columns for {', '.join(missing)} (found {', '.join(names) or 'none'}; "
                          f"name them with workload.columns.FIELD=COLUMN)")  # fmt: skip
    return found


_LONG_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_time(value: Any) -> tuple[float, bool]:
    """(seconds, absolute): a number as is, an ISO datetime as epoch seconds (naive = UTC)."""
    if isinstance(value, bool):  # a JSON true would be read as 1 s
        raise ValueError("a boolean, not a time")
    if isinstance(value, (int, float)):
        return _finite(float(value)), False
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return _finite(seconds), False
    # Python < 3.11 reads neither 7-digit fractions (Azure's) nor a trailing Z
    when = datetime.fromisoformat(_LONG_FRACTION.sub(r"\1", text).replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp(), True


def _finite(seconds: float) -> float:
    if not math.isfinite(seconds):  # nan would drop out of every window unnoticed
        raise ValueError("not a finite time")
    return seconds


def _count(value: Any, least: int = 1) -> int:
    if isinstance(value, bool):  # float(True) == 1: a JSON true would be read as 1 token
        raise ValueError("a boolean, not a token count")
    number = float(value)
    if not (least <= number <= MAX_TOKENS and number == int(number)):
        raise ValueError(f"not a whole number from {least} to {MAX_TOKENS:,}")
    return int(number)


def _prompt(value: Any) -> str | list[int]:
    """A prompt's text, or its token ids (a JSON list of them, as vLLM's ``prompt_token_ids``);
    any other JSON value (a chat's messages, an object) was tokenized as its Python repr."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        return value
    raise ValueError("a text, or a list of token ids (integers >= 0)")


def read_trace(path: Path, columns: Mapping[str, str], time_unit: str) -> TraceRows:
    text = _text(path)
    records = list(_records(path, text))
    check(bool(records), "workload.path", str(path), "a trace with at least one request")
    found = _find_columns(_header(path, text, [row for _, row in records]), columns, path)
    unit = time_unit
    if unit == "auto":
        mooncake = found["arrival_time"] == "timestamp" and found["prompt_len"] == "input_length"
        unit = "ms" if mooncake else "s"
    scale = TIME_UNITS[unit]
    out = TraceRows([], False, [], [], [], [])
    kinds = set()
    for line_no, row in records:
        field = "arrival_time"
        try:
            t, absolute = parse_time(row[found[field]])
            kinds.add(absolute)
            field = "output_len"
            output_len = _count(row[found[field]], least=0)
            if output_len == 0:  # a request that failed when the trace was recorded (as vLLM's
                out.failed += 1  # BurstGPT loader does, it is left out)
                continue
            out.times.append(t if absolute else t * scale)
            out.output_lens.append(output_len)
            field = "prompt"
            prompt = row.get(found[field]) if found[field] else None
            if prompt in (None, "", []):
                field = "prompt_len"
                check(found[field] is not None, "workload.path", f"{path}:{line_no}",
                      f"a prompt in column {found['prompt']!r}, as the file has no prompt_len column")  # fmt: skip
                out.prompt_lens.append(_count(row[found[field]]))
                out.prompts.append(None)
            else:
                out.prompts.append(_prompt(prompt))
                out.prompt_lens.append(_stated(row.get(found["prompt_len"]) if found["prompt_len"] else None))
        except (KeyError, ValueError, TypeError, OverflowError) as e:
            value = row.get(found[field]) if found[field] else None
            raise ConfigError("workload.path", f"{path}:{line_no}",
                              f"column {found[field]!r} holding {field} (got {value!r}: {e})") from None  # fmt: skip
        out.lines.append(line_no)
    check(bool(out.times), "workload.path", str(path), "a trace with at least one request of 1 output token or more")
    check(len(kinds) == 1, "workload.path", str(path), "arrival times all datetimes or all numbers, not a mix")
    out.absolute = kinds.pop() or _epoch_seconds(out, path, unit, found["arrival_time"])
    return out


def _stated(value: Any) -> int | None:
    """A row's prompt length beside its prompt: compared with the prompt, never used for it (a
    cell that is no count is as good as none)."""
    try:
        return None if value in (None, "") else _count(value)
    except (ValueError, TypeError, OverflowError):
        return None


def _epoch_seconds(rows: TraceRows, path: Path, unit: str, column: str | None) -> bool:
    """Whether numeric times are epoch seconds (all from 1e9 s to 2100) rather than offsets (all below 1e9 s)."""
    first = min(range(len(rows.times)), key=rows.times.__getitem__)
    last = max(range(len(rows.times)), key=rows.times.__getitem__)
    epoch = rows.times[first] >= EPOCH_MIN_S
    if epoch != (rows.times[last] >= EPOCH_MIN_S):
        got = f"got {rows.times[last]:.12g} s here, {rows.times[first]:.12g} s on line {rows.lines[first]}"
        raise ConfigError("workload.path", f"{path}:{rows.lines[last]}",
                          f"arrival times all offsets (< 1e9 s) or all epoch seconds (>= 1e9 s), not both "
                          f"({got}; times read in {unit}: is workload.time_unit right?)")  # fmt: skip
    if epoch and rows.times[last] >= EPOCH_MAX_S:
        raise ConfigError("workload.path", f"{path}:{rows.lines[last]}",
                          f"epoch seconds before 2100 in column {column!r} (got {rows.times[last]:.12g} s, "
                          f"times read in {unit}): if they are milliseconds, set workload.time_unit=ms "
                          f"(us: microseconds)")  # fmt: skip
    return epoch
