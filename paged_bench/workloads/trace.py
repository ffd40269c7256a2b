"""Replay of a recorded trace: a CSV or JSONL file, one request per row.

Columns (CSV header or JSON keys): ``arrival_time`` (seconds from the start), either
``prompt_len`` (random tokens of that length, from ``seed``) or ``prompt`` (text, tokenized by
the engine's tokenizer), and ``output_len``. ``time_scale`` stretches the arrival times
(0.5 replays twice as fast); ``limit`` keeps the first N requests.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from paged_bench.errors import ConfigError, check, check_int, check_number
from paged_bench.request import Request
from paged_bench.workloads.base import Workload, WorkloadContext


class TraceWorkload(Workload):
    name = "trace"

    def __init__(self, *, path: str, time_scale: float = 1.0, limit: int | None = None, seed: int = 0) -> None:
        self.path = Path(str(path)).expanduser()
        check(self.path.is_file(), "workload.path", str(path), "an existing .csv or .jsonl trace file")
        check(self.path.suffix in (".csv", ".jsonl"), "workload.path", str(path), "a file ending in .csv or .jsonl")
        self.time_scale = check_number("workload.time_scale", time_scale, 0, strict=True)
        self.limit = None if limit is None else check_int("workload.limit", limit)
        self.seed = check_int("seed", seed, 0)

    def _rows(self) -> list[dict[str, Any]]:
        with self.path.open(newline="") as f:
            if self.path.suffix == ".csv":
                return list(csv.DictReader(f))
            rows = []
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ConfigError("workload.path", f"{self.path}:{line_no}", f"one JSON object per line ({e.msg})") from None
            return rows

    def requests(self, ctx: WorkloadContext) -> list[Request]:
        rng = np.random.default_rng(self.seed)
        out = []
        for row_no, row in enumerate(self._rows()[: self.limit], 1):
            where = f"{self.path}, request {row_no}"
            try:
                arrival = float(row["arrival_time"]) * self.time_scale
                output_len = int(row["output_len"])
                if row.get("prompt") not in (None, ""):
                    tokens = ctx.encode(str(row["prompt"]))
                else:
                    tokens = rng.integers(0, ctx.vocab_size, int(row["prompt_len"])).tolist()
            except (KeyError, ValueError, TypeError) as e:
                raise ConfigError(
                    "workload.path", where, f"arrival_time, output_len and prompt_len or prompt in every row ({e!r})"
                ) from None
            check(arrival >= 0 and output_len >= 1 and tokens, "workload.path", where,
                  "arrival_time >= 0, output_len >= 1 and a non-empty prompt")
            out.append(Request(row_no - 1, arrival, tokens, output_len))
        check(bool(out), "workload.path", str(self.path), "a trace with at least one request")
        out.sort(key=lambda r: r.arrival_time)
        return out
