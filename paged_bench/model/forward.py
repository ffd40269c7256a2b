"""The Llama forward over one packed step, written once against ``Ops`` (numpy or torch).

Per layer: RMSNorm -> fused QKV matmul -> rotary positions on Q and K -> write the new K/V
into their pool slots -> attention over keys gathered through the block tables -> output
projection -> residual; RMSNorm -> fused gate/up matmul -> SiLU(gate) * up -> down -> residual.
Only the rows that sample a token go through the final norm and the LM head.

Under tensor parallelism (``comm``) the same code runs one rank's slice (``tp_shard``): the
output projection and down are row-parallel, so their partial sums are all-reduced, and the
LM head's vocabulary slices are gathered onto the rank that samples.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from paged_bench.model.batch import StepBatch
from paged_bench.model.config import ModelConfig
from paged_bench.model.weights import Weights


class Ops(Protocol):
    """The array primitives the forward needs; ``st`` is ``prepare``'s device-side batch."""

    def prepare(self, batch: StepBatch) -> Any: ...
    def embed(self, table: Any, st: Any) -> Any: ...
    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any: ...
    def linear(self, x: Any, weight: Any) -> Any: ...
    def rope(self, x: Any, st: Any, num_heads: int) -> Any: ...
    def write_kv(self, pool: Any, layer: int, st: Any, k: Any, v: Any) -> None: ...
    def attention(self, q: Any, pool: Any, layer: int, st: Any, scale: float) -> Any: ...
    def silu_mul(self, gate_up: Any) -> Any: ...
    def take(self, x: Any, st: Any) -> Any: ...


class Comm(Protocol):
    """What the ranks exchange in a tensor-parallel forward."""

    def all_reduce(self, x: Any) -> Any: ...
    def gather_logits(self, x: Any) -> Any: ...


class _Alone:
    """One rank holding the whole model: nothing to exchange."""

    def all_reduce(self, x: Any) -> Any:
        return x

    def gather_logits(self, x: Any) -> Any:
        return x


def forward(ops: Ops, w: Weights, cfg: ModelConfig, pool: Any, batch: StepBatch, comm: Comm | None = None) -> Any:
    """Logits ``[B, vocab]`` at each request's last new token; K/V written into ``pool``. With
    ``comm``, ``w`` and ``cfg`` are one rank's, and only the gathering rank gets logits."""
    comm = comm or _Alone()
    st = ops.prepare(batch)
    eps, q_end, k_end = cfg.rms_norm_eps, cfg.q_size, cfg.q_size + cfg.kv_size
    scale = cfg.head_dim**-0.5
    h = ops.embed(w.embed, st)
    for layer, lw in enumerate(w.layers):
        qkv = ops.linear(ops.rms_norm(h, lw.attn_norm, eps), lw.qkv)
        q = ops.rope(qkv[:, :q_end], st, cfg.num_heads)
        k = ops.rope(qkv[:, q_end:k_end], st, cfg.num_kv_heads)
        ops.write_kv(pool, layer, st, k, qkv[:, k_end:])
        h = h + comm.all_reduce(ops.linear(ops.attention(q, pool, layer, st, scale), lw.o))
        gate_up = ops.linear(ops.rms_norm(h, lw.mlp_norm, eps), lw.gate_up)
        h = h + comm.all_reduce(ops.linear(ops.silu_mul(gate_up), lw.down))
    return comm.gather_logits(ops.linear(ops.rms_norm(ops.take(h, st), w.norm, eps), w.lm_head))


def rope_table(cfg: ModelConfig, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``[num_positions, head_dim]`` in the rotate-half layout Hugging Face uses,
    computed in float32 as it does (so positions round the same way)."""
    d = cfg.head_dim
    inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))).astype(
        np.float32
    )
    freqs = np.arange(num_positions, dtype=np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)
