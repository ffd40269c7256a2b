"""Replay of a recorded trace: a CSV or JSONL file (or a shipped one, by name), one request per row.

Each row gives an arrival time, a prompt (its length: random token ids drawn from ``seed``;
its text, tokenized by the engine's tokenizer; or its token ids) and an output length;
``trace_files`` says which column names and time formats are understood. What is replayed:

- ``path``: the file, or the name of a trace shipped with paged_bench (``azure_llm_2023_conv``,
  see paged_bench/data/traces/README.md);
- ``columns``: our field -> the file's column name (null: found by name);
- ``start`` / ``duration``: a window, in seconds from the trace's first request (absolute
  traces) or from 0 (relative ones); ``start`` may also be an ISO datetime, no earlier than
  the first request (as a negative number is refused). Arrival times are counted from ``start``;
- ``limit``: the first N requests (by arrival) of the window;
- ``rate``: rescale the arrival times so the mean rate is ``rate`` requests/s (``inf``: all at
  once, for a closed loop with ``max_concurrency``); ``time_scale`` multiplies them instead
  (0.5 replays twice as fast);
- ``max_concurrency``: at most N requests in flight, the next sent as one ends.
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
from array import array
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from paged_bench.core.clock import HORIZON_S
from paged_bench.core.request import Request
from paged_bench.errors import ConfigError, check, check_int, check_number
from paged_bench.run.memory import check_requests_fit
from paged_bench.workloads.base import Workload, WorkloadContext, check_max_concurrency, random_prompts
from paged_bench.workloads.trace_files import (
    SUFFIXES,
    TIME_UNITS,
    TraceRows,
    check_columns,
    parse_time,
    read_trace,
    suffix,
)

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "traces"


# A process that builds the same trace's requests again and again (a capacity plan's worker
# runs one candidate after another at other rates) parses the file and draws its prompts once:
# about a third of a short simulation of the Azure trace otherwise. One of each is kept (the
# Azure trace's prompts are 176 MB). The key holds a digest of the file's bytes (milliseconds
# for the Azure trace), not its mtime: a file rewritten within the clock's tick keeps its mtime.
@functools.lru_cache(maxsize=1)
def _read_trace_cached(path: Path, digest: bytes, columns: tuple[tuple[str, str], ...], time_unit: str) -> TraceRows:
    return read_trace(path, dict(columns), time_unit)


def _rows(path: Path, columns: Mapping[str, str], time_unit: str) -> TraceRows:
    digest = hashlib.blake2b(path.read_bytes(), digest_size=16).digest()
    return _read_trace_cached(path, digest, tuple(sorted(columns.items())), time_unit)


@functools.lru_cache(maxsize=1)
def _drawn_prompts(seed: int, lens: bytes, vocab_size: int) -> list[array]:
    return random_prompts(np.random.default_rng(seed), np.frombuffer(lens, np.int64), vocab_size)


def _prompts(seed: int, lens: np.ndarray, vocab_size: int) -> list[array]:
    """``random_prompts`` of ``seed``, each a copy (a run appends its outputs to its prompt's array)."""
    return [prompt[:] for prompt in _drawn_prompts(seed, lens.tobytes(), vocab_size)]


def shipped_traces() -> dict[str, Path]:
    """Trace name -> file, for the traces that ship with the package."""
    return {p.name.split(".")[0]: p for p in sorted(SHIPPED.glob("*.gz"))}


def resolve_trace(path: Any) -> Path:
    p = Path(str(path)).expanduser()
    if p.is_file():
        check(suffix(p) in SUFFIXES, "workload.path", str(path), f"a file ending in {', '.join(SUFFIXES)}")
        return p
    shipped = shipped_traces()
    check(str(path) in shipped, "workload.path", str(path),
          f"an existing trace file, or a shipped trace: {', '.join(shipped) or 'none'}")  # fmt: skip
    return shipped[str(path)]


class TraceWorkload(Workload):
    name = "trace"

    def __init__(
        self,
        *,
        path: str,
        columns: Mapping[str, str | None] | None = None,
        time_unit: str = "auto",
        start: float | str = 0.0,
        duration: float | None = None,
        limit: int | None = None,
        rate: float | None = None,
        time_scale: float = 1.0,
        max_concurrency: int | None = None,
        seed: int = 0,
    ) -> None:
        self.path = resolve_trace(path)
        self.columns = check_columns(columns)
        known = time_unit == "auto" or (isinstance(time_unit, str) and time_unit in TIME_UNITS)
        check(known, "workload.time_unit", time_unit,
              f"auto, {', '.join(TIME_UNITS)}")  # fmt: skip
        self.time_unit = time_unit
        self.start = start if isinstance(start, str) else check_number("workload.start", start)
        self.duration = None if duration is None else check_number("workload.duration", duration, 0, strict=True)
        self.limit = None if limit is None else check_int("workload.limit", limit)
        self.rate = None if rate is None else check_number("workload.rate", rate, 0, strict=True, finite=False)
        self.time_scale = check_number("workload.time_scale", time_scale, 0, strict=True)
        check(self.rate is None or self.time_scale == 1.0, "workload.time_scale", time_scale,
              "1.0 when workload.rate is set (rate rescales the arrival times itself; where an experiment "
              "set this time_scale, add workload.time_scale=1.0 beside workload.rate)")  # fmt: skip
        self.max_concurrency = check_max_concurrency(max_concurrency)
        self.seed = check_int("workload.seed", seed, 0)

    def _window_start(self, origin: float, absolute: bool) -> float:
        if not isinstance(self.start, str):
            return self.start
        try:
            when, is_datetime = parse_time(self.start)
        except ValueError:
            is_datetime = False
        check(is_datetime and absolute, "workload.start", self.start,
              "seconds from the trace's start, or an ISO datetime for a trace with absolute times")  # fmt: skip
        # earlier than the first request would replay an idle lead-in (years, for a mistyped year),
        # which start=-1 is refused for
        first = datetime.fromtimestamp(origin, timezone.utc).isoformat()
        check(when >= origin, "workload.start", self.start, f"a datetime from the trace's first request ({first}) on")
        return when - origin

    def requests(self, ctx: WorkloadContext) -> list[Request]:
        rows = _rows(self.path, self.columns, self.time_unit)
        if rows.failed:
            print(f"note: {rows.failed} rows of {self.path} with 0 output tokens (requests that failed when it was "
                  "recorded) are left out", file=sys.stderr)  # fmt: skip
        origin = min(rows.times) if rows.absolute else 0.0
        start = self._window_start(origin, rows.absolute)
        end = math.inf if self.duration is None else start + self.duration
        if not rows.absolute and (bad := next((i for i, t in enumerate(rows.times) if t < 0), None)) is not None:
            raise ConfigError("workload.path", f"{self.path}:{rows.lines[bad]}", f"arrival times >= 0 (got {rows.times[bad]})")
        arrivals = [t - origin - start for t in rows.times]
        kept = sorted((i for i, a in enumerate(arrivals) if 0 <= a < end - start), key=arrivals.__getitem__)
        kept = kept[: self.limit]
        check(bool(kept), "workload.start", self.start, self._empty_window(rows, origin, start, end))
        times = self._rescale(np.array([arrivals[i] for i in kept]))
        kept_in_file_order = sorted(kept)
        lens = np.array([rows.prompt_lens[i] or 0 for i in kept_in_file_order if rows.prompts[i] is None], np.int64)
        if len(lens):
            check_requests_fit(len(lens), float(lens.mean()), count_key="workload.limit", count=self.limit,
                               lengths_key="workload.path", lengths=str(self.path))  # fmt: skip
        drawn = iter(_prompts(self.seed, lens, ctx.vocab_size))
        tokens = {}
        for i in kept_in_file_order:
            where = f"{self.path}:{rows.lines[i]}"
            tokens[i] = self._prompt_tokens(rows.prompts[i], drawn, ctx, where)
        _note_stated_lengths(rows, tokens, self.path)
        return [Request(i, t, tokens[i], rows.output_lens[i]) for i, t in zip(kept, times.tolist())]

    @staticmethod
    def _prompt_tokens(prompt: str | list[int] | None, drawn: Any, ctx: WorkloadContext, where: str) -> Any:
        """A row's prompt tokens: drawn at random (a length), tokenized (a text) or as given (token ids)."""
        if prompt is None:
            return next(drawn)
        if isinstance(prompt, str):
            tokens = ctx.encode(prompt)
            check(len(tokens) >= 1, "workload.path", where, "a non-empty prompt in every row")
            return tokens
        check(max(prompt) < ctx.vocab_size, "workload.path", where,
              f"token ids below the model's vocabulary size, {ctx.vocab_size:,} (got {max(prompt):,})")  # fmt: skip
        return prompt

    def _empty_window(self, rows: TraceRows, origin: float, start: float, end: float) -> str:
        """What an empty window is refused with: the window, and where the requests are."""
        first, last = min(rows.times) - origin, max(rows.times) - origin
        since = "its first request" if rows.absolute else "0"
        return (f"a window holding at least one request (the window is {start:g} to {end:g} s; "
                f"{self.path}'s requests arrive {first:g} to {last:g} s from {since})")  # fmt: skip

    def _rescale(self, arrivals: np.ndarray) -> np.ndarray:
        """To ``rate`` (mean gap 1/rate between the first and the last arrival), or by ``time_scale``."""
        if self.rate is None:
            _check_within_horizon("workload.time_scale", self.time_scale, arrivals[-1] * self.time_scale)
            return arrivals * self.time_scale
        span = arrivals[-1] - arrivals[0]
        if math.isinf(self.rate) or len(arrivals) == 1:
            return np.zeros_like(arrivals)
        if span <= 0:
            raise ConfigError("workload.rate", self.rate, "inf for a trace whose requests all arrive at once")
        _check_within_horizon("workload.rate", self.rate, (len(arrivals) - 1) / self.rate)
        return (arrivals - arrivals[0]) * ((len(arrivals) - 1) / self.rate / span)


def _check_within_horizon(key: str, value: float, last_arrival: float) -> None:
    """Arrivals the run's clock can reach (a rate of 5e-324 put the last one at nan s, and the run
    failed at its first idle wait naming no key)."""
    check(last_arrival < HORIZON_S, key, value,
          f"a value that puts the last arrival within the clock's {HORIZON_S:.0e} s (it falls at {last_arrival:.3g} s)")


def _note_stated_lengths(rows: TraceRows, tokens: dict[int, Any], path: str) -> None:
    """Say so when rows give a prompt and a prompt length that disagree: the prompt is sent
    (as this backend's tokenizer reads a text; a trace recorded under another tokenizer counts
    it otherwise), and its length is what the run reports."""
    off = [i for i in tokens if rows.prompts[i] is not None and rows.prompt_lens[i] not in (None, len(tokens[i]))]
    if off:
        i = off[0]
        print(f"note: {len(off)} of {len(tokens)} rows of {path} give a prompt whose length here is not the "
              f"row's prompt length (line {rows.lines[i]}: {len(tokens[i])} tokens, {rows.prompt_lens[i]} stated): "
              "the prompt is sent, as long as it is here", file=sys.stderr)  # fmt: skip
