"""The engine's per-step CPU work, by batch size: a named preset (``backend.engine_cpu``).

``vllm_v0``: vLLM v0's measured CPU milliseconds per step (Vidur's ``a100_vllm_v0`` overheads:
schedule, prepare inputs, sampler, process model outputs, summed; every profiled model and TP
degree), fitted as ``base + per_seq x batch size`` (least squares). vLLM v0 runs them one after
the other with the forward (no overlap), so they add to the step. Ray's communication time in
the same file is left out: vLLM runs single-node TP with multiprocessing workers by default.
``none``: no CPU figure (an engine whose CPU work hides behind the GPU's).

The figure stays apart from the GPU's (``StepCost.cpu``): multi-step scheduling pays it once
for several forwards, all but the sampler's part (``StepCost.cpu_each_step``, Vidur's
``sampler_e2e`` fitted alone): vLLM 0.6.0's multi-step "performs scheduling and input preparation
once and runs the model for n consecutive steps" (its 2024-09-05 post), samples on every step, and
overlaps output processing with the GPU (async output processing, the same post).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from paged_bench.costmodel.measured.profiles import read_data
from paged_bench.errors import check_choice

ENGINE_CPU = ("vllm_v0", "none")
_PARTS = ("schedule", "prepare_inputs_e2e", "sampler_e2e", "process_model_outputs")
_EACH_STEP = ("sampler_e2e",)  # what a multi-step window's later steps still run


@dataclass(frozen=True)
class EngineCPU:
    name: str
    base: float  # seconds per step
    per_seq: float  # seconds per scheduled sequence
    each_step_base: float = 0.0  # the part of base that every step of a multi-step window pays
    each_step_per_seq: float = 0.0

    def seconds(self, num_seqs: int) -> float:
        return self.base + self.per_seq * num_seqs if num_seqs else 0.0

    def each_step_seconds(self, num_seqs: int) -> float:
        """The sampler's share of ``seconds``: paid on a multi-step window's later steps too."""
        return self.each_step_base + self.each_step_per_seq * num_seqs if num_seqs else 0.0


def _fit(bs: np.ndarray, ms: np.ndarray) -> tuple[float, float]:
    """Least-squares ``base + per_seq x batch size`` in seconds, neither below 0."""
    (base, per), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(bs), bs]), ms, rcond=None)
    return max(float(base), 0.0) * 1e-3, max(float(per), 0.0) * 1e-3


@cache
def engine_cpu(name: str, key: str = "backend.engine_cpu") -> EngineCPU:
    check_choice(key, name, ENGINE_CPU)
    if name == "none":
        return EngineCPU(name, 0.0, 0.0)
    rows = read_data("engine_cpu.csv")
    bs = np.array([float(r["batch_size"]) for r in rows])
    total = _fit(bs, np.array([sum(float(r[p]) for p in _PARTS) for r in rows]))
    each_step = _fit(bs, np.array([sum(float(r[p]) for p in _EACH_STEP) for r in rows]))
    return EngineCPU(name, *total, *each_step)
