"""A GPU's elementwise operations (norms, rotary, activation, residual add, embedding lookup),
each priced per element it touches from the profiles.

Every one is memory-bound: it reads and writes its rows once. So each op costs
``launch + per_element x elements`` on a GPU, over every profiled model and TP degree of that
GPU: ``per_element`` is the slope (least squares) of the rows of 512 tokens or more, where the
bytes dominate; ``launch`` the median of what the rows of 16 tokens or fewer
take beyond their elements (a few microseconds: a kernel's launch and its one wave). The elements an op
touches follow from the model's shape on one rank (``op_elements``): a norm, the residual add
and the embedding lookup a token's whole hidden vector (replicated on every rank), rotary a
token's query and key heads on the rank, the activation its slice of the MLP (gate and up read,
one written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from paged_bench.costmodel.measured.profiles import KernelRow, kernel_rows

LARGE, SMALL = 512, 16  # tokens: rows that fit the per-element slope, rows that fit the launch
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
    launch: float  # seconds
    per_element: float  # seconds

    def seconds(self, elements: float) -> float:
        return self.launch + self.per_element * elements if elements > 0 else 0.0


def fit_elementwise(gpu: str, leave_out: str | None = None) -> dict[str, OpCost]:
    """Each op's cost on ``gpu`` from its profiles (but ``leave_out``'s rows)."""
    out = {}
    for op, (names, tokens, x, t) in _points(gpu).items():
        keep = names != leave_out
        tokens, x, t = tokens[keep], x[keep], t[keep]
        big = tokens >= LARGE
        per = float(np.polyfit(x[big], t[big], 1)[0])  # the large rows' slope
        launch = float(np.median(t[tokens <= SMALL] - per * x[tokens <= SMALL]))
        out[op] = OpCost(max(launch, 0.0), max(per, 0.0))
    return out


@cache
def _points(gpu: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per op: (model name, tokens, elements, seconds) of every row of ``gpu`` that times it."""
    rows, out = kernel_rows(gpu), {}
    for op in ELEMENTWISE_OPS:
        timed = [r for r in rows if not math.isnan(r.ms[op])]
        out[op] = (np.array([r.model.name for r in timed]), np.array([r.num_tokens for r in timed], float),
                   np.array([op_elements(op, row_shape(r), r.num_tokens) for r in timed], float),
                   np.array([r.ms[op] * 1e-3 for r in timed]))  # fmt: skip
    return out
