"""A GPU's elementwise operations (norms, rotary, activation, residual add, embedding lookup),
each priced per element it touches from the profiles.

Every one is memory-bound: it reads and writes its rows once. So each op costs
``launch + per_element x elements`` on a GPU, fitted (least squares on relative error, both terms
kept >= 0) over every profiled model, TP degree and token count of that GPU. The elements an op
touches follow from the model's shape on one rank (``op_elements``): a norm, the residual add
and the embedding lookup a token's whole hidden vector (replicated on every rank), rotary a
token's query and key heads on the rank, the activation its slice of the MLP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from paged_bench.costmodel.measured.profiles import KernelRow, kernel_rows

ELEMENTWISE_OPS = ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")


@dataclass(frozen=True)
class Shape:
    """What the element counts need of a model on one rank."""

    hidden_size: int
    q_heads: int  # on the rank
    kv_heads: int  # on the rank
    head_dim: int
    intermediate: int  # the MLP's slice on the rank


def op_elements(op: str, shape: Shape, tokens: float) -> float:
    if op == "attn_rope":
        return tokens * (shape.q_heads + shape.kv_heads) * shape.head_dim
    if op == "mlp_act":
        return tokens * shape.intermediate
    return tokens * shape.hidden_size


def row_shape(row: KernelRow) -> Shape:
    m = row.model
    return Shape(m.hidden_size, m.num_heads // row.tp, max(1, m.num_kv_heads // row.tp), m.head_dim,
                 m.intermediate_size // row.tp)  # fmt: skip


@dataclass(frozen=True)
class OpCost:
    launch: float  # seconds
    per_element: float  # seconds

    def seconds(self, elements: float) -> float:
        return self.launch + self.per_element * elements if elements > 0 else 0.0


def fit_elementwise(gpu: str, leave_out: str | None = None) -> dict[str, OpCost]:
    """Each op's cost on ``gpu`` from its profiles (but ``leave_out``'s rows)."""
    out = {}
    for op, (names, x, t) in _points(gpu).items():
        keep = names != leave_out
        x, t = x[keep], t[keep]
        a = np.column_stack([np.ones_like(x), x]) / t[:, None]
        (launch, per), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        if launch < 0:  # keep both terms physical: refit the slope alone
            launch, per = 0.0, float(np.sum(x / t) / np.sum((x / t) ** 2))
        if per < 0:
            launch, per = float(np.median(t)), 0.0
        out[op] = OpCost(float(launch), float(per))
    return out


@cache
def _points(gpu: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per op: (model name, elements, seconds) of every row of ``gpu`` that times it."""
    rows, out = kernel_rows(gpu), {}
    for op in ELEMENTWISE_OPS:
        timed = [r for r in rows if not math.isnan(r.ms[op])]
        out[op] = (np.array([r.model.name for r in timed]),
                   np.array([op_elements(op, row_shape(r), r.num_tokens) for r in timed], float),
                   np.array([r.ms[op] * 1e-3 for r in timed]))  # fmt: skip
    return out
