"""The forward's primitives in numpy (float32): the reference implementation on any CPU."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paged_bench.model.batch import AttnGroup, StepBatch
from paged_bench.model.config import ModelConfig
from paged_bench.model.forward import rope_table


@dataclass
class _Group:
    src: AttnGroup
    mask: np.ndarray  # [G, 1, 1, N, L] additive: 0 where allowed, -inf elsewhere
    out_rows: np.ndarray  # packed rows the group's real queries write to


@dataclass
class _Step:
    batch: StepBatch
    cos: np.ndarray  # [T, 1, head_dim]
    sin: np.ndarray
    groups: list[_Group]


class NumpyOps:
    dtype = np.float32

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self._cos, self._sin = rope_table(cfg, 2048)  # grows on demand

    def asarray(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.float32)

    def asmatrix(self, a: np.ndarray) -> np.ndarray:
        """``[out, in]`` -> contiguous ``[in, out]``: BLAS runs ``x @ W`` faster for the short
        row counts of decode steps than ``x @ W.T``."""
        return np.ascontiguousarray(a.T, dtype=np.float32)

    def new_pool(self, num_slots: int, host: bool = False) -> np.ndarray:
        """K and V of every layer: ``[layers, slots, 2, kv_heads, head_dim]`` (a slot's K and V
        side by side: attention gathers both in one pass), zeroed (masked keys are multiplied
        by 0 and must not be NaN). ``host`` (the swap space) changes nothing: all is host memory.

        Zeroed by writing every page now, not by ``np.zeros`` (calloc's lazily mapped pages):
        resident from the start, as ``torch.zeros`` leaves vLLM's KV cache and swap space.
        Else a step that writes a block for the first time page-faults it in, and a run's
        allocator hands out blocks no step has written for most of the run: about one fault per
        two prompt tokens, 0.5-1 ms a seed prompt step that no timed shape pays."""
        c = self.cfg
        pool = np.empty((c.num_layers, num_slots, 2, c.num_kv_heads, c.head_dim), np.float32)
        pool.fill(0)
        return pool

    def copy_slots(self, src: np.ndarray, dst: np.ndarray, src_slots: np.ndarray, dst_slots: np.ndarray) -> None:
        dst[:, dst_slots] = src[:, src_slots]

    def prepare(self, batch: StepBatch) -> _Step:
        top = int(batch.positions.max()) + 1
        if top > len(self._cos):  # rotary positions are defined for any position: extend
            self._cos, self._sin = rope_table(self.cfg, max(top, 2 * len(self._cos)))
        groups = []
        for g in batch.groups:
            mask = np.where(g.allowed(), np.float32(0), np.float32(-np.inf))[:, None, None]
            groups.append(_Group(g, mask, g.rows[g.valid]))
        return _Step(batch, self._cos[batch.positions][:, None], self._sin[batch.positions][:, None], groups)

    def embed(self, table: np.ndarray, st: _Step) -> np.ndarray:
        return table[st.batch.input_ids]

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * weight

    def linear(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x @ weight

    def rope(self, x: np.ndarray, st: _Step, num_heads: int) -> np.ndarray:
        x = x.reshape(len(x), num_heads, self.cfg.head_dim)
        half = self.cfg.head_dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * st.cos + rotated * st.sin

    def write_kv(self, pool: np.ndarray, layer: int, st: _Step, k: np.ndarray, v: np.ndarray) -> None:
        slots = st.batch.slots
        pool[layer, slots, 0] = k
        pool[layer, slots, 1] = v.reshape(k.shape)

    def attention(self, q: np.ndarray, pool: np.ndarray, layer: int, st: _Step, scale: float) -> np.ndarray:
        c = self.cfg
        kvh, grp, d = c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim
        out = np.empty((len(q), c.q_size), np.float32)
        for g in st.groups:
            n_g, n_q = g.src.rows.shape
            # [G, N, H, d] -> [G, kv_heads, group, N, d]: the query heads sharing a KV head
            qg = q[g.src.rows].reshape(n_g, n_q, kvh, grp, d).transpose(0, 2, 3, 1, 4)
            kv = pool[layer][g.src.ctx_slots]  # [G, L, 2, kvh, d]: the paged gather
            kg = kv[:, :, 0].transpose(0, 2, 3, 1)[:, :, None]  # [G, kvh, 1, d, L]
            vg = kv[:, :, 1].transpose(0, 2, 1, 3)[:, :, None]  # [G, kvh, 1, L, d]
            s = (qg @ kg) * np.float32(scale) + g.mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = (s @ vg).transpose(0, 3, 1, 2, 4).reshape(n_g, n_q, c.q_size)
            out[g.out_rows] = o[g.src.valid]
        return out

    def silu_mul(self, gate_up: np.ndarray) -> np.ndarray:
        gate, up = np.split(gate_up, 2, axis=-1)
        # sigmoid via tanh: no overflow warnings for large negative gates
        return gate * (np.float32(0.5) * (np.float32(1) + np.tanh(np.float32(0.5) * gate))) * up

    def take(self, x: np.ndarray, st: _Step) -> np.ndarray:
        return x[st.batch.sample_rows]

    def to_numpy(self, logits: np.ndarray) -> np.ndarray:
        return logits

    def argmax(self, logits: np.ndarray) -> list[int]:
        return logits.argmax(axis=-1).tolist()
