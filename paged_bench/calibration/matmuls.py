"""The matmul curve: a real backend's own matmuls timed at every row count a step may have.

A single-threaded CPU BLAS is far from a roofline at a decode step's few rows (a
matrix-vector kernel at one row, the matrix-matrix kernel's edge cases at two and three), so
calibration measures what a step's matmuls cost at each row count rather than deriving it
from peak FLOP/s and bandwidth; ``RooflineCost`` interpolates the curve.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from paged_bench.backends.base import Backend
from paged_bench.calibration.shapes import typical_seconds
from paged_bench.core.clock import STEP_TIMERS
from paged_bench.model.config import ModelConfig

MatmulCurve = tuple[tuple[float, float, float], ...]  # (rows, every layer's seconds, the LM head's)


def curve_points(max_tokens: int) -> list[int]:
    """Every row count up to 16 (where a BLAS's kernel edges make the cost jump about), then
    a geometric grid up to ``max_tokens``."""
    points = list(range(1, min(16, max_tokens) + 1))
    n = 16
    while n < max_tokens:
        n = min(int(n * 1.5), max_tokens)
        points.append(n)
    return points


def matmul_rounds(backend: Backend, model: ModelConfig, max_tokens: int) -> Iterator[MatmulCurve]:
    """The backend's own matmuls timed at each row count of ``curve_points``, a round over
    every row count at a time (the first round, untimed, warms up): after each, the curve so
    far, each point the ``typical_seconds`` of its rounds: (rows, seconds of every layer's
    QKV/output/gate-up/down, seconds of the LM head).

    Run under the backend's thread settings (after ``bind``), on its weights, with its
    ``ops.linear``: what a step's matmuls cost on this BLAS, edge cases and all."""
    ops, w = backend.ops, backend.weights
    timer = STEP_TIMERS[backend.step_timer]  # as the engine times the backend's steps
    rng = np.random.default_rng(0)
    points = curve_points(max_tokens)
    inputs = {  # one input per distinct width, sliced to the row count
        dim: ops.asarray(rng.standard_normal((max_tokens, dim), dtype=np.float32))
        for dim in {model.hidden_size, model.q_size, model.intermediate_size}
    }
    layer_ops = [(inputs[d], m) for lw in w.layers for d, m in
                 ((model.hidden_size, lw.qkv), (model.q_size, lw.o), (model.hidden_size, lw.gate_up),
                  (model.intermediate_size, lw.down))]  # fmt: skip
    head = (inputs[model.hidden_size], w.lm_head)
    times: dict[int, list[tuple[float, float]]] = {n: [] for n in points}
    for round_no in itertools.count():
        for n in points:
            # a run's decode step follows others of about its size, which left the weights
            # and the BLAS's state as it needs them: a point timed after one untimed pass,
            # right after the largest point, costs 40% more at one row than in a run (0.29
            # against 0.20 ms here). So a few untimed passes first, then several timed ones
            # (a decode batch's row counts, a millisecond or so a pass), their median
            passes = 5 if n <= 32 else 1
            for _ in range(passes):
                for x, m in layer_ops:
                    ops.linear(x[:n], m)
            for _ in range(passes):
                start = timer()
                for x, m in layer_ops:
                    ops.linear(x[:n], m)
                mid = timer()
                ops.linear(head[0][:n], head[1])
                if round_no:
                    times[n].append((mid - start, timer() - mid))
        if round_no:
            yield tuple(
                (float(n), typical_seconds([t[0] for t in ts]), typical_seconds([t[1] for t in ts]))
                for n, ts in times.items()
            )


def time_matmuls(backend: Backend, model: ModelConfig, max_tokens: int, repeats: int = 5) -> MatmulCurve:
    """``matmul_rounds``' curve after ``repeats`` timed rounds."""
    *_, curve = itertools.islice(matmul_rounds(backend, model, max_tokens), repeats)
    return curve
