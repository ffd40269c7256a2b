"""The shipped kernel profiles: Vidur's per-layer operation timings, as extracted into ``data/``.

Each row is one model's layer on one GPU at one TP degree and token count, with the median
milliseconds of every non-attention operation (``benchmarks/extract_vidur.py`` regenerates the
extract; ``data/README.md`` says where it comes from and under which licence). ``gemm_rows``
turns a GPU's rows into the (M, N, K) of the four matmuls a layer runs on one rank, the shapes
vLLM's Megatron split gives (``sizing.tp_shard``): fused QKV, the attention output, fused gate
and up (up alone for a model without a gated MLP), and down.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

import numpy as np

DATA = Path(__file__).with_name("data")
OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
       "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")  # fmt: skip
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# what one layer runs, in the profiles: every operation but the embedding lookup (once a step)
LAYER_OPS = tuple(op for op in OPS if op != "emb")


@dataclass(frozen=True)
class ProfiledModel:
    """A profiled model's shape, as the profiles name it."""

    name: str
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class KernelRow:
    """One profiled layer: milliseconds by operation (NaN where the model has none)."""

    gpu: str
    model: ProfiledModel
    tp: int
    num_tokens: int
    ms: dict[str, float]

    def layer_ms(self) -> float:
        """The layer's measured milliseconds: its operations' sum (attention not profiled here)."""
        return sum(v for op, v in self.ms.items() if op in LAYER_OPS and not math.isnan(v))


@dataclass(frozen=True)
class GemmShapes:
    """Matmul timings as arrays: rows M (tokens), N (output features), K (input features)."""

    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    ms: np.ndarray
    model: np.ndarray  # the profiled model's name, per row (to leave one out)
    op: np.ndarray  # the layer's matmul, per row (GEMM_OPS)

    def where(self, keep: np.ndarray) -> GemmShapes:
        """The rows ``keep`` marks."""
        return GemmShapes(*(getattr(self, f.name)[keep] for f in fields(self)))


def read_data(name: str) -> list[dict[str, str]]:
    raw = (DATA / name).read_bytes()
    text = gzip.decompress(raw).decode() if name.endswith(".gz") else raw.decode()
    return list(csv.DictReader(io.StringIO(text)))


@cache
def models() -> dict[str, ProfiledModel]:
    return {
        r["model"]: ProfiledModel(r["model"], int(r["n_head"]), int(r["n_kv_head"]), int(r["n_embd"]),
                                  int(r["n_expanded_embd"]), int(r["vocab_size"]), r["use_gated_mlp"] == "True")
        for r in read_data("models.csv")
    }  # fmt: skip


@cache
def kernel_rows(gpu: str) -> tuple[KernelRow, ...]:
    shapes = models()
    return tuple(
        KernelRow(gpu, shapes[r["model"]], int(r["tp"]), int(r["num_tokens"]),
                  {op: float(r[op]) if r[op] else math.nan for op in OPS})
        for r in read_data("kernels.csv.gz") if r["gpu"] == gpu
    )  # fmt: skip


def gemm_dims(model: ProfiledModel, tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) of each of a layer's matmuls on one of ``tp`` ranks."""
    d, h = model.head_dim, model.hidden_size
    heads, kv = model.num_heads // tp, max(1, model.num_kv_heads // tp)
    up = (2 if model.gated_mlp else 1) * model.intermediate_size // tp
    return {
        "attn_pre_proj": ((heads + 2 * kv) * d, h),
        "attn_post_proj": (h, heads * d),
        "mlp_up_proj": (up, h),
        "mlp_down_proj": (h, model.intermediate_size // tp),
    }


def gemm_rows(gpu: str, leave_out: str | None = None) -> GemmShapes:
    """Every matmul the profiles timed on ``gpu`` (but ``leave_out``'s)."""
    rows = _gemm_rows(gpu)
    if leave_out is None:
        return rows
    return rows.where(rows.model != leave_out)


@cache
def _gemm_rows(gpu: str) -> GemmShapes:
    cols: dict[str, list[object]] = {"m": [], "n": [], "k": [], "ms": [], "model": [], "op": []}
    for row in kernel_rows(gpu):
        for op, (out, inner) in gemm_dims(row.model, row.tp).items():
            for key, value in zip(cols, (row.num_tokens, out, inner, row.ms[op], row.model.name, op)):
                cols[key].append(value)
    m, n, k, ms = (np.asarray(cols[key], float) for key in ("m", "n", "k", "ms"))
    return GemmShapes(m, n, k, ms, np.asarray(cols["model"]), np.asarray(cols["op"]))
