"""Leave-one-out check of the kernel fits: a profiled model's per-layer time predicted from a
fit that never saw it (issue 35: within 10% at 1, 16, 256 and 2,048 tokens on H100 and A100).
``benchmarks/measured_loo.py`` prints the table; the tests assert the bound."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from paged_bench.costmodel.measured.elementwise import row_shape
from paged_bench.costmodel.measured.gemm import Waves
from paged_bench.costmodel.measured.profiles import gemm_dims, kernel_rows
from paged_bench.costmodel.measured.step import LAYER_ELEMENTWISE, fit_kernels, layer_seconds

TOKENS = (1, 16, 256, 2048)


@dataclass(frozen=True)
class Point:
    tokens: int
    measured_ms: float
    predicted_ms: float

    @property
    def error(self) -> float:
        return self.predicted_ms / self.measured_ms - 1


@dataclass(frozen=True)
class HeldOut:
    gpu: str
    model: str
    tp: int
    points: tuple[Point, ...]


def leave_one_out(gpu: str, tps: Sequence[int] | None = None, models: Sequence[str] | None = None,
                  waves: Waves | None = None) -> Iterator[HeldOut]:  # fmt: skip
    """Per held-out model of ``gpu`` (all, or ``models``) and TP degree (all, or ``tps``); ``waves``:
    with a surface that pays for wave quantization (``benchmarks/measured_waves.py``)."""
    rows = kernel_rows(gpu)
    names = models or sorted({r.model.name for r in rows})
    for name in names:
        fit = fit_kernels(gpu, leave_out=name, waves=waves)
        mine = [r for r in rows if r.model.name == name and r.num_tokens in TOKENS]
        for tp in sorted({r.tp for r in mine}):
            if tps is not None and tp not in tps:
                continue
            points = []
            for r in sorted((r for r in mine if r.tp == tp), key=lambda r: r.num_tokens):
                ops = tuple(op for op in LAYER_ELEMENTWISE if not math.isnan(r.ms[op]))  # phi-2: one norm
                predicted = layer_seconds(fit, gemm_dims(r.model, tp), row_shape(r), r.num_tokens, ops) * 1e3
                points.append(Point(r.num_tokens, r.layer_ms(), predicted))
            yield HeldOut(gpu, name, tp, tuple(points))
