"""A GPU's elementwise operations (norms, rotary, activation, residual add, embedding lookup),
each priced by the elements it touches, read off the profiles.

Every one is memory-bound, but not linearly: a few microseconds whatever the size up to a few
hundred thousand elements (a launch and one wave), then bytes at a rate that drops once the rows
no longer fit the L2 cache (H100's norm: 4 us at 256 tokens of 4,096, 26 us at 2,048, 67 us at
4,096). So each op is a curve over log2(elements), per GPU: at each half-octave knot, the median
time of every profiled row (any model, any TP degree) that touches about that many elements;
read in between by log-log interpolation, held at the first knot below it, and extended in
proportion to the elements past the last. The elements an op touches follow from the model's
shape on one rank (``op_elements``): a norm, the residual add and the embedding lookup a token's
whole hidden vector (replicated on every rank), rotary a token's query and key heads on the
rank, the activation its slice of the MLP (gate and up read, one written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from paged_bench.costmodel.measured.profiles import KernelRow, kernel_rows

KNOT = 0.5  # log2(elements) between the curve's knots
ELEMENTWISE_OPS = ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")


@dataclass(frozen=True)
class Shape:
    """What the element counts need of a model on one rank."""

    hidden_size: int
    q_heads: int  # on the rank
    kv_heads: int  # on the rank
    head_dim: int
    intermediate: int  # the MLP's slice on the rank
    gated: bool = True  # SwiGLU: the activation reads gate and up, writes one


def op_elements(op: str, shape: Shape, tokens: float) -> float:
    if op == "attn_rope":
        return tokens * (shape.q_heads + shape.kv_heads) * shape.head_dim
    if op == "mlp_act":  # values read and written: gate and up in, one out (a plain MLP: one in, one out)
        return tokens * shape.intermediate * (3 if shape.gated else 2)
    return tokens * shape.hidden_size


def row_shape(row: KernelRow) -> Shape:
    m = row.model
    return Shape(m.hidden_size, m.num_heads // row.tp, max(1, m.num_kv_heads // row.tp), m.head_dim,
                 m.intermediate_size // row.tp, m.gated_mlp)  # fmt: skip


@dataclass(frozen=True)
class OpCost:
    """One op's measured curve: seconds at each knot of log2(elements)."""

    log2_elements: np.ndarray
    seconds_at: np.ndarray
    # elements priced as this many of the profiled GPU's: H200's 4.8 TB/s moves 3.35/4.8 of
    # H100's elements in the same time (the launch floor stays)
    element_scale: float = 1.0

    def seconds(self, elements: float) -> float:
        if elements <= 0:
            return 0.0
        lx, ts = math.log2(elements * self.element_scale), self.seconds_at
        if lx >= self.log2_elements[-1]:  # past the profiles: in proportion to the elements
            return float(ts[-1] * 2.0 ** (lx - self.log2_elements[-1]))
        return float(np.exp(np.interp(lx, self.log2_elements, np.log(ts))))


def fit_elementwise(gpu: str, leave_out: str | None = None) -> dict[str, OpCost]:
    """Each op's curve on ``gpu`` from its profiles (but ``leave_out``'s rows)."""
    out = {}
    for op, (names, lx, t) in _points(gpu).items():
        keep = names != leave_out
        lx, t = lx[keep], t[keep]
        knots = np.arange(np.floor(lx.min()), np.ceil(lx.max()) + KNOT, KNOT)
        near = np.abs(lx[None, :] - knots[:, None]) <= KNOT / 2
        has = near.any(axis=1)
        at = np.array([np.median(t[sel]) for sel in near[has]])
        out[op] = OpCost(knots[has], np.maximum.accumulate(at))  # more elements never cost less
    return out


@cache
def _points(gpu: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per op: (model name, log2 elements, seconds) of every row of ``gpu`` that times it."""
    rows, out = kernel_rows(gpu), {}
    for op in ELEMENTWISE_OPS:
        timed = [r for r in rows if not math.isnan(r.ms[op])]
        out[op] = (np.array([r.model.name for r in timed]),
                   np.log2([op_elements(op, row_shape(r), r.num_tokens) for r in timed]),
                   np.array([r.ms[op] * 1e-3 for r in timed]))  # fmt: skip
    return out
