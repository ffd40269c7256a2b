"""Tensor-parallel all-reduce from Vidur's measured curves (NCCL on DGX boards: NVSwitch).

Per GPU and rank count, the measured medians are fitted to the ring's own shape,
``latency + bytes / bandwidth`` (least squares on relative error), and read at a step's
activation bytes; this replaces the roofline's 9 us datasheet figure (``tp_link``). H200 takes
H100's curves (the same NVLink 4 and NVSwitch; derived). A GPU or rank count with no curve (A40,
whose profiles hold no all-reduce; more than 8 ranks) falls back to ``tp_link``'s datasheet model
on the hardware's link.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cache

import numpy as np

from paged_bench.costmodel.measured.profiles import read_data

CURVE_OF = {"h100": "h100", "h200": "h100", "a100": "a100"}


@dataclass(frozen=True)
class AllReduceCurve:
    latency: float  # seconds
    bandwidth: float  # bytes/s of the message (algorithm bandwidth)

    def seconds(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


@cache
def all_reduce_curves(gpu: str) -> dict[int, AllReduceCurve]:
    """The fitted curve by rank count, for ``gpu`` (empty: none measured)."""
    src = CURVE_OF.get(gpu)
    points: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in read_data("all_reduce.csv.gz"):
        if r["gpu"] == src:
            points[int(r["ranks"])].append((float(r["bytes"]), float(r["ms"]) * 1e-3))
    curves = {}
    for ranks, pts in points.items():
        x, t = np.array(pts).T
        a = np.column_stack([np.ones_like(x), x]) / t[:, None]
        (latency, per_byte), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        curves[ranks] = AllReduceCurve(max(float(latency), 0.0), 1.0 / max(float(per_byte), 1e-15))
    return curves
