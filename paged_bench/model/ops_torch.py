"""The forward's primitives in torch, on CPU or CUDA (float32, bfloat16 or float16).

Attention is ``scaled_dot_product_attention`` over K/V gathered through the block tables
(with ``enable_gqa`` so the KV heads are not copied per query head): the decodes as one group
padded to the longest context, each prefill chunk alone (``AttnGroup.each``: a short prompt
beside a long one is not padded to its shape); norms are computed in
float32 as in Hugging Face's Llama; the KV pool lives on the device, the swap space in
(pinned, on CUDA) host memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from paged_bench.errors import check
from paged_bench.model.batch import StepBatch
from paged_bench.model.config import ModelConfig
from paged_bench.model.forward import rope_table

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(device: str) -> torch.device:
    check(isinstance(device, str), "backend.device", device, "auto, cpu, cuda or cuda:N")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    check(dev is not None and dev.type in ("cpu", "cuda"), "backend.device", device, "auto, cpu, cuda or cuda:N")
    check(dev.type == "cpu" or torch.cuda.is_available(), "backend.device", device, "auto or cpu: no CUDA device here")
    return dev


def pick_dtype(dtype: str, device: torch.device) -> str:
    check(dtype == "auto" or dtype in DTYPES, "backend.dtype", dtype, f"auto, {', '.join(DTYPES)}")
    if dtype == "auto":
        return "bfloat16" if device.type == "cuda" else "float32"
    check(device.type == "cuda" or dtype == "float32", "backend.dtype", dtype, "float32 on the CPU (auto picks it)")
    return dtype


@dataclass
class _Group:
    rows: torch.Tensor  # [G, N]
    ctx_slots: torch.Tensor  # [G, L]
    mask: torch.Tensor  # [G, 1, N, L] bool: True = attend
    out_rows: torch.Tensor  # packed rows of the real queries
    valid: torch.Tensor | None  # [G, N] bool, None when every query is real


@dataclass
class _Step:
    ids: torch.Tensor
    slots: torch.Tensor
    cos: torch.Tensor  # [T, 1, head_dim]
    sin: torch.Tensor
    groups: list[_Group]
    sample_rows: torch.Tensor


class TorchOps:
    def __init__(self, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self._on_gpu = device.type == "cuda"
        self._set_rope(2048)  # grows on demand

    def _set_rope(self, n: int) -> None:
        cos, sin = rope_table(self.cfg, n)
        self._cos, self._sin = (torch.from_numpy(a).to(self.device, self.dtype) for a in (cos, sin))

    def _index(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, non_blocking=True)

    def asarray(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, self.dtype)

    asmatrix = asarray  # matmul weights stay [out, in], as stored

    def new_pool(self, num_slots: int, host: bool = False) -> torch.Tensor:
        """``[layers, slots, 2, kv_heads, head_dim]`` (a slot's K and V side by side: one
        gather reads both); ``host``: the swap space, in pinned host memory when the pool is
        on a GPU so copies run at the host link's speed."""
        c = self.cfg
        shape = (c.num_layers, num_slots, 2, c.num_kv_heads, c.head_dim)
        if host:
            pin = self.device.type == "cuda"
            return torch.zeros(shape, dtype=self.dtype, pin_memory=pin)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor, src_slots: np.ndarray, dst_slots: np.ndarray) -> None:
        moved = src[:, torch.from_numpy(src_slots).to(src.device)].to(dst.device)
        dst[:, torch.from_numpy(dst_slots).to(dst.device)] = moved

    def prepare(self, batch: StepBatch) -> _Step:
        top = int(batch.positions.max()) + 1
        if top > len(self._cos):
            self._set_rope(max(top, 2 * len(self._cos)))
        pos = self._index(batch.positions)
        groups = []
        for g in batch.groups:  # the decodes padded to the longest context; each prefill alone
            for one in [g] if g.rows.shape[1] == 1 else g.each():
                valid = None if one.all_valid else self._index(one.valid)
                groups.append(_Group(
                    self._index(one.rows), self._index(one.ctx_slots), self._index(one.allowed()[:, None]),
                    self._index(one.rows[one.valid]), valid,
                ))  # fmt: skip
        return _Step(
            self._index(batch.input_ids), self._index(batch.slots),
            self._cos[pos][:, None], self._sin[pos][:, None], groups, self._index(batch.sample_rows),
        )  # fmt: skip

    def embed(self, table: torch.Tensor, st: _Step) -> torch.Tensor:
        return table[st.ids]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(x.dtype)

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self._on_gpu:
            return F.linear(x, weight)
        # on the CPU, W @ x^T: MKL multiplies a decode step's few rows this way 1.3-1.5x
        # faster than x @ W^T once the weights stream from memory (measured, fp32, 1-2 threads)
        return torch.mm(weight, x.t()).t()

    def rope(self, x: torch.Tensor, st: _Step, num_heads: int) -> torch.Tensor:
        x = x.reshape(len(x), num_heads, self.cfg.head_dim)
        half = self.cfg.head_dim // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * st.cos + rotated * st.sin

    def write_kv(self, pool: torch.Tensor, layer: int, st: _Step, k: torch.Tensor, v: torch.Tensor) -> None:
        pool[layer].index_copy_(0, st.slots, torch.stack((k, v.reshape(k.shape)), dim=1))

    def attention(self, q: torch.Tensor, pool: torch.Tensor, layer: int, st: _Step, scale: float) -> torch.Tensor:
        c = self.cfg
        out = q.new_empty((len(q), c.q_size))
        for g in st.groups:
            n_g, n_q = g.rows.shape
            qg = q[g.rows].transpose(1, 2)  # [G, H, N, d]
            kv = pool[layer][g.ctx_slots]  # [G, L, 2, kvh, d]: the paged gather
            kg, vg = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)  # [G, kvh, L, d]
            o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, scale=scale, enable_gqa=True)
            o = o.transpose(1, 2).reshape(n_g, n_q, c.q_size)
            if g.valid is None:
                out[g.out_rows] = o.reshape(n_g * n_q, c.q_size)
            else:
                out[g.out_rows] = o[g.valid]
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def take(self, x: torch.Tensor, st: _Step) -> torch.Tensor:
        return x[st.sample_rows]

    def to_numpy(self, logits: torch.Tensor) -> np.ndarray:
        return logits.float().cpu().numpy()

    def argmax(self, logits: torch.Tensor) -> list[int]:
        return logits.argmax(dim=-1).tolist()
