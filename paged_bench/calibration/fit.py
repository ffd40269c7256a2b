"""The calibration's fit: the roofline's per-step, per-request and efficiency terms from timed steps.

``fit`` takes (work, seconds) samples of a real backend's steps (``shapes.time_shapes``)
and solves for what a measured matmul curve leaves: least squares on relative error,
non-negative (``_nnls``), alternating over which side of each roofline bounds each step.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np

from paged_bench.costmodel.roofline import RooflineCost
from paged_bench.costmodel.step_work import StepWork


def _nnls(a: np.ndarray, b: np.ndarray, tol: float = 1e-12) -> np.ndarray:
    """Non-negative least squares (Lawson and Hanson's active set method): min |a x - b|, x >= 0."""
    n = a.shape[1]
    x, free = np.zeros(n), np.zeros(n, bool)
    for _ in range(3 * n):
        gradient = a.T @ (b - a @ x)
        if free.all() or gradient[~free].max() <= tol:
            break
        free[np.argmax(np.where(free, -np.inf, gradient))] = True
        while True:  # solve on the free set; step back to the boundary while a value goes negative
            z = np.zeros(n)
            z[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
            if (z[free] > tol).all():
                x = z
                break
            neg = free & (z <= tol)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            free &= x > tol
            x[~free] = 0.0
    return x


_EFFS = ("compute_eff", "memory_eff", "attn_eff", "kv_eff")


# the terms added on top of either bound, each by what it counts in a step
ADDITIVE: dict[str, Callable[[StepWork], float]] = {
    "per_token": lambda w: w.num_tokens,
}


def check_terms(names: Collection[str]) -> None:
    unknown = sorted(set(names) - set(ADDITIVE))
    if unknown:
        raise ValueError(f"no fitted term {', '.join(unknown)}; the additive terms are {', '.join(ADDITIVE)}")


def fit(cost: RooflineCost, samples: Sequence[tuple[StepWork, float]], iterations: int = 30,
        without: Collection[str] = ()) -> RooflineCost:  # fmt: skip
    """Fit overhead, per_seq, the four efficiencies and the ``ADDITIVE`` terms (per token) of
    ``cost`` to measured step times (with a measured ``matmul_curve``, the matmuls are known
    and the rest is fitted to what they leave).

    Each roofline is a max, so this alternates: given which side bounds each kernel class of
    each step, the time is linear in (1, sequences, and the bounding side's FLOPs/peak or
    bytes/bandwidth); solve that (non-negative, on relative error so short and long steps
    count alike); re-decide the sides with the new efficiencies; until nothing changes.
    Alternation can settle in a local optimum, so it starts from every way of bounding the
    two kernel classes (and from the preset's own efficiencies) and keeps the best fit.
    ``without`` names additive terms to leave at 0 (what each one earns: ``benchmarks/term_evidence.py``)."""
    hw = cost.hardware
    t = np.array([s for _, s in samples])
    # with a measured matmul curve the matmuls are known: the rest is fitted to what is left
    curve = hw.matmul_curve is not None
    known = np.array([cost.matmul_seconds(w) if curve else 0.0 for w, _ in samples])
    seqs = np.array([w.num_seqs for w, _ in samples], float)
    # per kernel class: (compute seconds at peak, memory seconds at full bandwidth)
    sides = [
        (
            np.array([0.0 if curve else w.matmul_flops for w, _ in samples]) / hw.peak_flops,
            np.array([0.0 if curve else w.weight_bytes for w, _ in samples]) / hw.mem_bandwidth,
        ),
        (
            np.array([w.attn_flops for w, _ in samples]) / hw.peak_flops,
            np.array([w.kv_bytes + w.padding_kv_bytes * hw.eager_attention for w, _ in samples]) / hw.mem_bandwidth,
        ),
    ]
    check_terms(without)
    columns = [np.array([0.0 if name in without else float(count(w)) for w, _ in samples])
               for name, count in ADDITIVE.items()]  # fmt: skip
    prior = [1 / getattr(hw, name) for name in _EFFS]

    def decide(inv: list[float]) -> list[np.ndarray]:
        return [c * inv[2 * k] >= m * inv[2 * k + 1] for k, (c, m) in enumerate(sides)]

    def alternate(bound: list[np.ndarray]) -> RooflineCost:
        inv, x = list(prior), np.zeros(6 + len(columns))
        for _ in range(iterations):
            cols = [np.ones_like(t), seqs]
            for (c, m), b in zip(sides, bound):
                cols += [c * b, m * ~b]
            cols += columns
            a = np.stack(cols, axis=1) / t[:, None]
            x = _nnls(a, 1 - known / t)
            # a side no step is bound by keeps the prior; one the fit finds free costs ~nothing
            inv = [max(x[2 + i], 1e-6) if a[:, 2 + i].any() else inv[i] for i in range(4)]
            new_bound = decide(inv)
            if all((a == b).all() for a, b in zip(new_bound, bound)):
                break
            bound = new_bound
        effs = {name: float(1 / v) for name, v in zip(_EFFS, inv)}
        fitted = {"overhead": x[0], "per_seq": x[1], **dict(zip(ADDITIVE, x[6:]))}
        return cost.with_fit(**{k: float(v) for k, v in fitted.items()}, **effs)

    ones, zeros = np.ones_like(t, bool), np.zeros_like(t, bool)
    starts = [decide(prior)] + [[a, b] for a in (ones, zeros) for b in (ones, zeros)]
    fits = [alternate(start) for start in starts]
    return min(fits, key=lambda f: sum((f.seconds(w) / s - 1) ** 2 for w, s in samples))


def fit_errors(cost: RooflineCost, samples: Sequence[tuple[StepWork, float]]) -> dict[str, float]:
    rel = np.array([cost.seconds(w) / s - 1 for w, s in samples])
    return {
        "samples": len(samples),
        "median_abs_rel_err": float(np.median(np.abs(rel))),
        "max_abs_rel_err": float(np.abs(rel).max()),
    }
