"""Tensor-parallel all-reduce from measured timings: NCCL's curves (Vidur's, on DGX boards:
NVSwitch) and vLLM's own kernel for small messages.

Per GPU and rank count, NCCL's measured medians are fitted to the ring's own shape,
``latency + bytes / bandwidth`` (least squares on relative error), and read at a step's
activation bytes; this replaces the roofline's 9 us datasheet figure (``tp_link``). H200 takes
H100's curves (the same NVLink 4 and NVSwitch; derived). A GPU or rank count with no curve (A40,
whose profiles hold no all-reduce; more than 8 ranks) falls back to ``tp_link``'s datasheet model
on the hardware's link.

``all_reduce=vllm_custom`` (the default): vLLM reduces a message under 8 MB over NVLink with its
own kernel (custom_all_reduce.py, vllm-project/vllm#2192, on by default since v0.3.0; off with
``--disable-custom-all-reduce``), which for small messages takes a fraction of NCCL's time. Its
published timings are sglang's (sgl-project/sglang#2904, 2025-01-15: vLLM's custom all-reduce on
H100 without CUDA graphs, TP 2, 4 and 8, 512 B to 1 MB), the path vLLM runs outside a CUDA graph
(a copy into its registered buffer, then the kernel); inside a graph (decode steps) the copy and
the launch are gone, so these timings bound its cost from above. A message up to 1 MB costs the
cheaper of that timing (interpolated) and NCCL's fitted curve: at 32 KB 9-12 us against NCCL's
17-31, at 1 MB 27-45 us against 20-35 (two measurements on different machines). Past 1 MB,
where nobody timed vLLM's kernel, NCCL's curve stands for it. No GPU but H100 (and H200, derived)
has such timings. ``nccl``: every all-reduce NCCL's (vLLM with ``--disable-custom-all-reduce``,
or before v0.3.0).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cache

import numpy as np

from paged_bench.costmodel.measured.profiles import read_data

CURVE_OF = {"h100": "h100", "h200": "h100", "a100": "a100"}
ALL_REDUCE = ("vllm_custom", "nccl")
# vLLM's custom all-reduce on H100, not in a CUDA graph: sgl-project/sglang#2904's description,
# "unit test performance in H100 (without cuda graph)", the "vllm" table (latency ms by TP size)
CUSTOM_BYTES = (512, 4096, 32768, 262144, 524288, 1048576)
CUSTOM_US = {
    "h100": {2: (9.5, 8.8, 8.7, 12.9, 17.7, 26.6), 4: (9.1, 8.5, 9.2, 20.6, 26.9, 40.2),
             8: (10.1, 9.3, 11.8, 24.1, 30.4, 45.0)},
}  # fmt: skip


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


def custom_all_reduce_seconds(gpu: str, ranks: int, nbytes: float) -> float | None:
    """vLLM's custom all-reduce of ``nbytes`` over ``ranks`` GPUs as measured (interpolated between
    the measured sizes; the smallest's time below it), or None where it was not measured (the GPU,
    the rank count, or a message past 1 MB)."""
    by_ranks = CUSTOM_US.get(CURVE_OF.get(gpu, gpu), {})
    if ranks not in by_ranks or nbytes > CUSTOM_BYTES[-1]:
        return None
    return float(np.interp(nbytes, CUSTOM_BYTES, by_ranks[ranks])) * 1e-6
