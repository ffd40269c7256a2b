"""The engine's per-step records: one row per step, read back as named columns.

Appending a row is the only per-step cost (it lands in a flat list); every ``CHUNK_ROWS``
rows are sealed into typed numpy columns, so a long run's records cost 8 bytes a value and
``column(name)`` is a concatenation. A server keeps only the latest ``max_records`` rows
(whole chunks beyond them are dropped), so its memory stays flat.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

CHUNK_ROWS = 4096


class StepRow(NamedTuple):
    """One step as the engine saw it. KV figures are sampled while the step computes: after
    scheduling (so preempted requests are gone) and before finished requests are freed."""

    step: int
    time: float  # clock time at the end of the step
    duration: float
    batch_size: int  # requests scheduled
    prefill_tokens: int  # scheduled tokens that are not decodes (prompt chunks, recomputation)
    decode_tokens: int  # requests computing one generated token and sampling the next
    running: int  # after the step (finished requests gone)
    waiting: int
    kv_live_slots: int  # slots holding K/V of requests that hold them, during the step
    kv_reserved_slots: int  # slots in held blocks, during the step
    kv_free_blocks: int
    preemptions: int
    swapped_blocks: int


STEP_COLUMNS: tuple[str, ...] = StepRow._fields
_FLOAT_COLUMNS = frozenset({"time", "duration"})
_DTYPES = tuple(np.float64 if c in _FLOAT_COLUMNS else np.int64 for c in STEP_COLUMNS)
_WIDTH = len(STEP_COLUMNS)


class StepRecords:
    columns = STEP_COLUMNS

    def __init__(self, max_records: int | None = None) -> None:
        self.max_records = max_records
        self._chunk_rows = CHUNK_ROWS if max_records is None else max(1, min(CHUNK_ROWS, max_records))
        self._chunks: deque[tuple[np.ndarray, ...]] = deque()  # sealed rows, a typed array per column
        self._sealed_rows = 0
        self._tail: list = []  # unsealed rows, flattened
        self._tail_len = self._chunk_rows * _WIDTH

    def record(
        self,
        *,
        step: int,
        time: float,
        duration: float,
        batch_size: int,
        prefill_tokens: int,
        decode_tokens: int,
        running: int,
        waiting: int,
        kv_live_slots: int,
        kv_reserved_slots: int,
        kv_free_blocks: int,
        preemptions: int,
        swapped_blocks: int,
    ) -> None:
        """Add one step, its values named as ``StepRow``'s fields."""
        self.append((step, time, duration, batch_size, prefill_tokens, decode_tokens, running, waiting,
                     kv_live_slots, kv_reserved_slots, kv_free_blocks, preemptions, swapped_blocks))  # fmt: skip

    def append(self, row: tuple) -> None:
        """Add one step's values, in ``STEP_COLUMNS`` order."""
        tail = self._tail
        tail.extend(row)
        if len(tail) >= self._tail_len:
            self._seal()

    def _seal(self) -> None:
        tail = self._tail
        self._chunks.append(tuple(np.array(tail[j::_WIDTH], dtype) for j, dtype in enumerate(_DTYPES)))
        self._sealed_rows += len(tail) // _WIDTH
        self._tail = []
        if self.max_records is not None:  # drop whole chunks that fall outside the window
            while self._sealed_rows - len(self._chunks[0][0]) >= self.max_records:
                self._sealed_rows -= len(self._chunks.popleft()[0])

    def __len__(self) -> int:
        n = self._sealed_rows + len(self._tail) // _WIDTH
        return n if self.max_records is None else min(n, self.max_records)

    def __bool__(self) -> bool:
        return len(self) > 0

    def column(self, name: str) -> np.ndarray:
        """One column over the kept rows (int64, or float64 for ``time`` and ``duration``)."""
        j = STEP_COLUMNS.index(name)
        parts = [chunk[j] for chunk in self._chunks]
        parts.append(np.array(self._tail[j::_WIDTH], _DTYPES[j]))
        out = np.concatenate(parts)
        return out[len(out) - len(self) :]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepRecords):
            return NotImplemented
        return list(self.rows()) == list(other.rows())

    __hash__ = None  # type: ignore[assignment]

    def __iter__(self) -> Iterator[StepRow]:
        return self.rows()

    def rows(self) -> Iterator[StepRow]:
        """The kept rows, oldest first, with Python ints and floats."""
        cols = [self.column(name).tolist() for name in STEP_COLUMNS]
        return (StepRow(*values) for values in zip(*cols))

    def last(self) -> StepRow | None:
        """The latest row, or None before the first step."""
        if self._tail:
            return StepRow(*self._tail[-_WIDTH:])
        if not self._chunks:
            return None
        return StepRow(*(col[-1].item() for col in self._chunks[-1]))
