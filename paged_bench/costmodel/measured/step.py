"""The measured cost model of a step (``backend.cost_model=measured``): kernels others timed on
real GPUs, added up for a step's plan.

A step on one rank (the ranks run in parallel) costs

    gpu = layers x (4 matmuls on the GPU's fitted surface (``gemm``)
                    + norms, rotary, activation, residual add (``elementwise``)
                    + attention: prefill and decode kernels (``attention``)
                    + 2 all-reduces of tokens x hidden (``collectives``; TP only: NCCL's, or
                      vLLM's own kernel where cheaper, ``all_reduce``))
        + the LM head on the sampled rows (the surface) + embedding lookup and final norm
        + swapped blocks over the host link
    cpu = the engine's per-step CPU work by batch size (``engine_cpu``; 0 with ``none``)

``StepCost`` keeps the two figures apart (multi-step scheduling pays ``cpu`` once for several
forwards); ``duration`` is their sum. Profiled GPUs: h100, a100, a40. ``h200`` is derived: H100's
kernels with the memory-bound sides (matmul bandwidth, elementwise ops) scaled to H200's
4.8 TB/s from H100's 3.35, H100's compute and all-reduce curves. The profiles ran bf16/fp16.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache, cached_property

import numpy as np

from paged_bench.core.plan import StepPlan
from paged_bench.costmodel.measured.attention import (
    ATTENTION_EFF,
    DECODE_KERNELS,
    AttentionEff,
    AttentionWork,
    attention_seconds,
    paged_decode_share,
)
from paged_bench.costmodel.measured.collectives import ALL_REDUCE, all_reduce_curves, custom_all_reduce_seconds
from paged_bench.costmodel.measured.elementwise import OpCost, Shape, fit_elementwise, op_elements
from paged_bench.costmodel.measured.engine_cpu import EngineCPU, engine_cpu
from paged_bench.costmodel.measured.gemm import SMS, GemmSurface, Waves, fit_surface
from paged_bench.costmodel.measured.profiles import GEMM_OPS, gemm_rows
from paged_bench.costmodel.roofline import HARDWARE, RooflineCost
from paged_bench.errors import check, check_choice
from paged_bench.model.config import DTYPE_BYTES

MEASURED_GPUS = ("h100", "a100", "a40", "h200")
# a GPU priced from another's profiles: (profiled GPU, its bandwidth over the profiled one's)
DERIVED = {"h200": ("h100", HARDWARE["h200"].mem_bandwidth / HARDWARE["h100"].mem_bandwidth)}
LAYER_ELEMENTWISE = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")


@dataclass(frozen=True)
class Kernels:
    """One GPU's fitted kernels."""

    gpu: str
    surface: GemmSurface
    elementwise: dict[str, OpCost]


@dataclass(frozen=True)
class StepCost:
    gpu: float  # seconds of kernels, collectives and swaps
    cpu: float  # seconds of the engine's CPU work (schedule, prepare inputs, sampler, outputs)
    cpu_each_step: float = 0.0  # the sampler's share of cpu: a multi-step window's later steps pay only it

    @property
    def total(self) -> float:
        return self.gpu + self.cpu


def datasheet(gpu: str) -> tuple[float, float]:
    """(peak FLOP/s, bytes/s) of a measured GPU: its hardware preset's datasheet figures."""
    return HARDWARE[gpu].peak_flops, HARDWARE[gpu].mem_bandwidth


def fit_kernels(gpu: str, leave_out: str | None = None, waves: Waves | None = None) -> Kernels:
    """``gpu``'s kernels fitted to its profiles (without ``leave_out``'s, to check the fit; with
    ``waves``, a surface that pays for wave quantization on ``gpu``'s SMs: the check of it)."""
    if gpu in DERIVED:
        src, scale = DERIVED[gpu]
        base = fit_kernels(src, leave_out, waves)
        surface = replace(base.surface, bandwidth=base.surface.bandwidth * scale)
        ops = {op: replace(c, element_scale=c.element_scale / scale) for op, c in base.elementwise.items()}
        return Kernels(gpu, surface, ops)
    peak, bandwidth = datasheet(gpu)
    waves = None if waves is None else replace(waves, sms=SMS[gpu])
    return Kernels(gpu, fit_surface(gemm_rows(gpu, leave_out), peak, bandwidth, waves),
                   fit_elementwise(gpu, leave_out))  # fmt: skip


@cache
def kernels(gpu: str) -> Kernels:
    return fit_kernels(gpu)


def layer_seconds(
    k: Kernels, dims: dict[str, tuple[int, int]], shape: Shape, tokens: int, ops: tuple[str, ...] = LAYER_ELEMENTWISE
) -> float:
    """One layer's matmuls and elementwise ``ops`` on ``tokens`` rows (no attention, no
    collective): what the profiles time as a layer."""
    n, kk = (np.array([dims[op][i] for op in GEMM_OPS], float) for i in (0, 1))
    gemms = float(k.surface.seconds(np.full(len(GEMM_OPS), float(tokens)), n, kk).sum())
    return gemms + sum(k.elementwise[op].seconds(op_elements(op, shape, tokens)) for op in ops)


def measured_cost(
    base: RooflineCost, engine: str = "vllm_v0", all_reduce: str = "vllm_custom", decode_attention: str = "flash"
) -> MeasuredCost:
    """``base``'s model on its GPU, priced from that GPU's profiles, with the engine's CPU work
    ``engine``, its all-reduce ``all_reduce`` and its decode attention kernel ``decode_attention``;
    a one-line error naming the option where the GPU has no profiles, the dtype is not what the
    profiles ran, or a choice is unknown."""
    gpu = base.hardware.name
    check(gpu in MEASURED_GPUS, "backend.hardware", gpu,
          f"{', '.join(MEASURED_GPUS)} with cost_model=measured (the GPUs with kernel profiles)")  # fmt: skip
    check(DTYPE_BYTES[base.dtype] == 2, "backend.dtype", base.dtype,
          "bfloat16 or float16 with cost_model=measured (what the profiled kernels ran)")  # fmt: skip
    check_choice("backend.all_reduce", all_reduce, ALL_REDUCE)
    check_choice("backend.decode_attention", decode_attention, DECODE_KERNELS)
    # the sampler works on the whole vocabulary's logits (gathered from the TP ranks)
    return MeasuredCost(base, engine_cpu(engine, base.model.vocab_size), kernels(gpu), all_reduce, decode_attention)


STEP_ENDS = ("emb", "input_layernorm")  # elementwise ops once a step, not once a layer


@dataclass(frozen=True)
class TokenCountCost:
    """A step's seconds that depend only on how many tokens it computes."""

    layer: float  # one layer's matmuls and elementwise ops
    all_reduces: float  # one layer's two tensor-parallel all-reduces (0 at TP 1)
    ends: float  # the embedding and the first norm, once a step


@dataclass(frozen=True)
class MeasuredCost:
    """A step's cost from measured kernels; ``base`` holds the model, hardware preset, dtype and
    TP split (and sizes the KV pool as the roofline does)."""

    base: RooflineCost
    engine: EngineCPU
    kernels: Kernels
    all_reduce: str = "vllm_custom"  # ALL_REDUCE: vLLM's own kernel where measured cheaper, or NCCL's alone
    decode_attention: str = "flash"  # DECODE_KERNELS: FlashAttention's paged decoding, or vLLM's PagedAttention

    @property
    def gemm_dims(self) -> dict[str, tuple[int, int]]:
        s, m = self.base.shard, self.base.model
        d = m.head_dim
        return {
            "attn_pre_proj": ((s.num_heads + 2 * s.num_kv_heads) * d, m.hidden_size),
            "attn_post_proj": (m.hidden_size, s.num_heads * d),
            "mlp_up_proj": (2 * s.intermediate_size, m.hidden_size),
            "mlp_down_proj": (m.hidden_size, s.intermediate_size),
        }

    @property
    def shape(self) -> Shape:
        s, m = self.base.shard, self.base.model
        return Shape(m.hidden_size, s.num_heads, s.num_kv_heads, m.head_dim, s.intermediate_size)

    def attention_work(self, plan: StepPlan) -> AttentionWork:
        """One layer's attention on this rank: (query, key) pairs and K/V bytes by kernel."""
        m, s = self.base.model, self.base.shard
        kv_token = s.kv_bytes_per_token(self.base.dtype) / m.num_layers  # one layer's K and V
        qo_token = 2 * s.num_heads * m.head_dim * DTYPE_BYTES[self.base.dtype]  # a query read, an output written
        pre_pairs = pre_kv = pre_new = dec_pairs = dec_kv = decodes = 0
        for start, n in zip(plan.num_computed_tokens, plan.num_new_tokens):
            if n == 1:
                dec_pairs, dec_kv, decodes = dec_pairs + start + 1, dec_kv + start + 1, decodes + 1
            elif n > 1:
                pre_pairs += n * start + n * (n + 1) // 2
                pre_kv, pre_new = pre_kv + start + n, pre_new + n
        per_pair = 4.0 * s.num_heads * m.head_dim
        return AttentionWork(
            prefill_flops=per_pair * pre_pairs,
            prefill_row_flops=per_pair * pre_new,
            prefill_bytes=(pre_kv + pre_new) * kv_token + pre_new * qo_token,  # read K/V, write the new
            decode_flops=per_pair * dec_pairs,
            decode_bytes=(dec_kv + decodes) * kv_token + decodes * qo_token,
            decode_context=dec_kv / decodes if decodes else 0.0,
            has_prefill=pre_new > 0,
            has_decode=decodes > 0,
        )

    def all_reduce_seconds(self, nbytes: float) -> float:
        tp, gpu = self.base.tp, self.kernels.gpu
        curve = all_reduce_curves(gpu).get(tp)
        nccl = curve.seconds(nbytes) if curve is not None else self.base.link.allreduce_seconds(nbytes, tp)
        custom = custom_all_reduce_seconds(gpu, tp, nbytes) if self.all_reduce == "vllm_custom" else None
        return nccl if custom is None else min(nccl, custom)

    def gpu_seconds(self, plan: StepPlan, block_size: int) -> float:
        m, dtype, hw, k = self.base.model, self.base.dtype, self.base.hardware, self.kernels
        swap = (len(plan.swap_in) + len(plan.swap_out)) * block_size * self.base.shard.kv_bytes_per_token(dtype)
        tokens, seqs = sum(plan.num_new_tokens), len(plan.req_ids)
        if not tokens:
            return swap / hw.host_link
        peak, bandwidth = datasheet(k.gpu)
        by_tokens = self._by_token_count(tokens)
        layer = by_tokens.layer
        work = self.attention_work(plan)
        layer += attention_seconds(work, self._attention_eff(work), peak, bandwidth, k.surface.launch)
        if self.base.tp > 1:
            layer += by_tokens.all_reduces
        sampled = seqs - len(plan.partial_rows)  # vLLM computes logits only for the rows that sample
        head = self._head_seconds(sampled) if sampled else 0.0
        return m.num_layers * layer + head + by_tokens.ends + swap / hw.host_link

    def _attention_eff(self, work: AttentionWork) -> AttentionEff:
        """The kernels' efficiencies on this GPU; with vLLM's PagedAttention for decodes, its share
        of bandwidth at the step's mean context and this model's query heads a K/V head."""
        eff = ATTENTION_EFF[self.kernels.gpu]
        if self.decode_attention != "vllm_paged" or not work.has_decode:
            return eff
        shard = self.base.shard
        share = paged_decode_share(self.kernels.gpu, work.decode_context, shard.num_heads // shard.num_kv_heads)
        return replace(eff, decode_bandwidth=share)

    @cached_property
    def _token_counts(self) -> dict[int, TokenCountCost]:
        return {}

    def _by_token_count(self, tokens: int) -> TokenCountCost:
        """What a step costs for its token count alone, computed once a count: a run's steps
        come in few distinct counts, and the fitted surface's evaluation was most of a
        simulation's time; the figures are the same to the bit."""
        cost = self._token_counts.get(tokens)
        if cost is None:
            m, k = self.base.model, self.kernels
            all_reduces = 2 * self.all_reduce_seconds(tokens * m.hidden_size * DTYPE_BYTES[self.base.dtype])
            ends = sum(k.elementwise[op].seconds(op_elements(op, self.shape, tokens)) for op in STEP_ENDS)
            cost = self._token_counts[tokens] = TokenCountCost(layer_seconds(k, self.gemm_dims, self.shape, tokens),
                                                               all_reduces if self.base.tp > 1 else 0.0, ends)  # fmt: skip
        return cost

    @cached_property
    def _heads(self) -> dict[int, float]:
        return {}

    def _head_seconds(self, sampled: int) -> float:
        """The LM head's matmul for ``sampled`` rows, computed once a count."""
        seconds = self._heads.get(sampled)
        if seconds is None:
            m = self.base.model
            seconds = self._heads[sampled] = float(self.kernels.surface.seconds(sampled, self.base.shard.vocab_size,
                                                                                 m.hidden_size))  # fmt: skip
        return seconds

    def step_cost(self, plan: StepPlan, block_size: int) -> StepCost:
        seqs = len(plan.req_ids)
        return StepCost(
            self.gpu_seconds(plan, block_size), self.engine.seconds(seqs), self.engine.each_step_seconds(seqs)
        )

    def duration(self, plan: StepPlan, block_size: int) -> float:
        """The step's seconds; a multi-step window's later step pays no scheduling or input
        preparation, only the sampler's CPU (docs/costmodel.md)."""
        cost = self.step_cost(plan, block_size)
        return cost.gpu + cost.cpu_each_step if plan.window_step else cost.total
