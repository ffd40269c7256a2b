"""The engine's per-step CPU work, by batch size: a named preset (``backend.engine_cpu``).

``vllm_v0``: vLLM v0's measured CPU milliseconds per step (Vidur's ``a100_vllm_v0`` overheads:
schedule, prepare inputs, sampler, process model outputs, summed; every profiled model and TP
degree), fitted by least squares. Schedule, input preparation and output processing are
``base + per_seq x batch size`` over every profiled model. The sampler grows with the
vocabulary too (it works on a batch x vocabulary of logits): at 64 sequences it took 0.82-0.89
ms for the 32k-token vocabularies, 1.25 for internlm-20b's 103k and 1.98 for Qwen-72B's 152k, so
it is ``a + b x batch + (c + d x batch) x vocabulary``, read at the served model's vocabulary.
Pooled over the models instead (as until 2026-12-07) it missed each model's sampler by a median
13-40%; so fitted, by 3-10% (3-18% with the model left out of the fit, Qwen-72B the furthest:
``benchmarks/measured_figures.py`` prints each model's). vLLM v0 runs these one after the other with the forward
(no overlap), so they add to the step. Ray's communication time in the same file is left out:
vLLM runs single-node TP with multiprocessing workers by default.
``none``: no CPU figure (an engine whose CPU work hides behind the GPU's).

The figure stays apart from the GPU's (``StepCost.cpu``): multi-step scheduling pays it once
for several forwards, all but the sampler's part (``StepCost.cpu_each_step``): vLLM 0.6.0's
multi-step "performs scheduling and input preparation once and runs the model for n consecutive
steps" (its 2024-09-05 post), samples on every step, and overlaps output processing with the GPU
(async output processing, the same post).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from paged_bench.costmodel.measured.profiles import models, read_data
from paged_bench.errors import check_choice

ENGINE_CPU = ("vllm_v0", "none")
_PARTS = ("schedule", "prepare_inputs_e2e", "process_model_outputs")  # by batch size alone
_SAMPLER = "sampler_e2e"  # by batch size and vocabulary; what a multi-step window's later steps still run


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


def _least_squares(columns: list[np.ndarray], ms: np.ndarray) -> np.ndarray:
    coefficients, *_ = np.linalg.lstsq(np.column_stack(columns), ms, rcond=None)
    return coefficients


def _sampler_columns(rows: list[dict[str, str]], vocab: dict[str, int]) -> list[np.ndarray]:
    """1, batch, vocabulary, batch x vocabulary of each row (its vocabulary: its model's in ``vocab``)."""
    bs = np.array([float(r["batch_size"]) for r in rows])
    v = np.array([float(vocab[r["model"].split("/")[-1]]) for r in rows])
    return [np.ones_like(bs), bs, v, bs * v]


def sampler_fit(rows: list[dict[str, str]], vocab: dict[str, int]) -> np.ndarray:
    """(a, b, c, d) of ``sampler ms = a + b x batch + (c + d x batch) x vocabulary`` over ``rows``
    (``engine_cpu.csv``'s), each row's vocabulary looked up by its model's name in ``vocab``."""
    return _least_squares(_sampler_columns(rows, vocab), np.array([float(r[_SAMPLER]) for r in rows]))


def sampler_errors(fit: np.ndarray, rows: list[dict[str, str]], vocab: dict[str, int]) -> np.ndarray:
    """``sampler_fit``'s ``fit`` against each of ``rows``' measured sampler: relative errors."""
    predicted = np.column_stack(_sampler_columns(rows, vocab)) @ fit
    return predicted / np.array([float(r[_SAMPLER]) for r in rows]) - 1


@cache
def engine_cpu(name: str, vocab_size: int, key: str = "backend.engine_cpu") -> EngineCPU:
    """The ``name`` preset for a model whose vocabulary holds ``vocab_size`` tokens."""
    check_choice(key, name, ENGINE_CPU)
    if name == "none":
        return EngineCPU(name, 0.0, 0.0)
    rows = read_data("engine_cpu.csv")
    bs = np.array([float(r["batch_size"]) for r in rows])
    base, per = _least_squares([np.ones_like(bs), bs], np.array([sum(float(r[p]) for p in _PARTS) for r in rows]))
    a, b, c, d = sampler_fit(rows, {profiled: m.vocab_size for profiled, m in models().items()})
    # neither part below 0; a vocabulary beyond the profiled ones (32k-152k) extends the fitted lines
    sampler_base, sampler_per = max(a + c * vocab_size, 0.0) * 1e-3, max(b + d * vocab_size, 0.0) * 1e-3
    base, per = max(float(base), 0.0) * 1e-3, max(float(per), 0.0) * 1e-3
    return EngineCPU(name, base + sampler_base, per + sampler_per, sampler_base, sampler_per)
