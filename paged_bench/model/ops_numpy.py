"""The forward's primitives in numpy (float32): the reference implementation on any CPU.

Attention is eager (the score matrix is materialised), so its memory is bounded here: decodes
(one query each) run as one padded group, but each prefill chunk runs alone, in slices of
query rows whose scores hold at most ``SCORE_ELEMENTS`` floats, each slice against the keys up
to its own last position. Padding every prefill of a step to the longest (the group as
``model.batch`` packs it) cost a step of 16 prompts, one 1,952-token chunk beside fifteen short
ones at 4,000 tokens of context, 16 x 8 heads x 1,952 x 4,000 scores: 4 GB, and with the
softmax's temporaries the server's 5.7 GB peak (issue 36). A 2,048-token chunk alone still
held 262 MB of scores (1.1 GB peak); sliced, a prefill's scores take 4 MiB whatever its length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from paged_bench.model.batch import AttnGroup, StepBatch
from paged_bench.model.config import ModelConfig
from paged_bench.model.forward import rope_table

# the most attention scores (floats) one slice of a prefill holds: 4 MiB. A bound on memory, and
# on time: the slice's scores and the softmax's temporaries stay in the caches. With 16 MiB
# slices a 512-token chunk after 512 tokens took 45% longer here, and the Azure window's prompt
# steps 8-20% (benchmarks/numpy_score_slices.py); with 2 MiB ones a chunk after 3,072 tokens
# slows down again (more, shorter slices)
SCORE_ELEMENTS = 1 << 20


@dataclass
class _Group:
    src: AttnGroup
    mask: np.ndarray | None  # decodes: [G, 1, 1, 1, L] additive, 0 where allowed, -inf elsewhere
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
            if g.rows.shape[1] == 1:  # the decodes, padded to the longest context
                mask = np.where(g.allowed(), np.float32(0), np.float32(-np.inf))[:, None, None]
                groups.append(_Group(g, mask, g.rows[g.valid]))
            else:  # each prefill alone; its masks are made per slice (see attention)
                groups.extend(_Group(one, None, one.rows[0]) for one in g.each())
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
        out = np.empty((len(q), self.cfg.q_size), np.float32)
        for g in st.groups:
            if g.mask is not None:
                out[g.out_rows] = self._padded(q, pool[layer], g, scale)
            else:
                self._prefill(q, pool[layer], g.src.rows[0], g.src.q_pos[0], g.src.ctx_slots[0], scale, out)
        return out

    def _heads(self, q: np.ndarray) -> np.ndarray:
        """``[..., N, H, d]`` -> ``[..., kv_heads, group, N, d]``: the query heads sharing a KV head."""
        c = self.cfg
        q = q.reshape(*q.shape[:-2], c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim)
        return np.moveaxis(q, -4, -2)

    def _attend(self, qg: np.ndarray, kv: np.ndarray, mask: Any, scale: float) -> np.ndarray:
        """Softmax attention of ``qg`` ``[..., kvh, grp, N, d]`` over ``kv`` ``[..., L, 2, kvh, d]``;
        ``[..., N, H * d]``."""
        kg = np.moveaxis(kv[..., 0, :, :], -3, -1)[..., None, :, :]  # [..., kvh, 1, d, L]
        vg = np.moveaxis(kv[..., 1, :, :], -3, -2)[..., None, :, :]  # [..., kvh, 1, L, d]
        s = (qg @ kg) * np.float32(scale) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = np.moveaxis(s @ vg, -2, -4)  # [..., N, kvh, grp, d]
        return o.reshape(*o.shape[:-3], self.cfg.q_size)

    def _padded(self, q: np.ndarray, pool: np.ndarray, g: _Group, scale: float) -> np.ndarray:
        """The decodes, one query each, padded to the longest context: the real queries' rows."""
        o = self._attend(self._heads(q[g.src.rows]), pool[g.src.ctx_slots], g.mask, scale)
        return o[g.src.valid]

    def _prefill(self, q: np.ndarray, pool: np.ndarray, rows: np.ndarray, q_pos: np.ndarray, ctx: np.ndarray,
                 scale: float, out: np.ndarray) -> None:  # fmt: skip
        """One prefill chunk (queries at consecutive positions ``q_pos``) in slices of rows whose
        scores fit ``SCORE_ELEMENTS``, each against the keys up to its own last position."""
        per_row = self.cfg.num_heads * (int(q_pos[-1]) + 1)
        step = max(1, SCORE_ELEMENTS // per_row)
        for a in range(0, len(rows), step):
            pos = q_pos[a : a + step]
            end = int(pos[-1]) + 1
            allowed = np.arange(end)[None, :] <= pos[:, None]
            mask = np.where(allowed, np.float32(0), np.float32(-np.inf))
            out[rows[a : a + step]] = self._attend(self._heads(q[rows[a : a + step]]), pool[ctx[:end]], mask, scale)

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
