"""Attention priced from its FLOPs and bytes at kernel efficiencies others published.

Vidur's attention profiles are not shipped (too large), so attention is a roofline per kernel:
a prefill kernel (FlashAttention's varlen forward, what vLLM 0.x runs for prompts) at a fraction
of peak FLOPs, and a decode kernel (FlashAttention's paged decoding, or vLLM's own PagedAttention:
``backend.decode_attention``, below) at a fraction of peak bandwidth, each
bounded by the other side at the same efficiencies, plus one launch per kernel and layer. The
fractions, by GPU:

- prefill, H100: 0.35 for a long prompt, less for a short one. FlashAttention-3 (Shah et al.,
  2024, arXiv:2407.08608, abstract): FlashAttention-2 reaches only 35% of H100's peak; vLLM 0.6
  ran FlashAttention-2 (its vllm-flash-attn fork). The paper's forward-pass figure (also the
  flash-attention repository's assets/flash3_fp16_fwd.png, panel (d): causal, head dimension
  128, H100 80GB SXM5, 16k tokens a batch) times FlashAttention-2 by sequence length
  (``FA2_H100_CAUSAL_TFLOPS``): 191 TFLOP/s at 512 tokens rising to 335 at 16k. A kernel that
  pays a fixed cost for every query row beside its causal pairs runs at ``0.35 n / (n + 400)``
  of peak on an n-token prompt, within 5% of each bar: each prompt token costs 200 key
  positions' work more (``prefill_half_rate_tokens / 2``), half the long-prompt rate at 400
  tokens. The diagonal tiles a causal mask half wastes and each tile's load of Q and write of
  the output are that cost. A100 takes the same length, an assumption with support: no forward
  bars by length were found for A100, but the same kernels run there (FlashAttention-2 has none of
  Hopper's own), and the repository's forward-and-backward charts rise alike on both GPUs (causal,
  head dimension 128: 512 tokens at 0.50 of the 16k rate on H100, 163 against 328 TFLOP/s,
  assets/flash2_h100_fwd_bwd_benchmark.png; 0.52 on A100, 99 against 189,
  assets/flash2_a100_fwd_bwd_benchmark.png).
- prefill, A100: 0.60 for a long prompt. FlashAttention-2 (Dao, 2023, arXiv:2307.08691,
  abstract): it reaches 50-73% of A100's theoretical peak; 0.60 sits in that range for causal
  attention at head dimension 128, below the non-causal maxima.
- decode, all GPUs: 0.70 of peak bandwidth. FlashInfer's kernel study (Ye et al., "Accelerating
  Self-Attentions for LLM Serving with FlashInfer", flashinfer.ai blog, 2024-02-02) shows batch
  decode attention bound by bandwidth and rates kernels by the share of peak bandwidth they
  reach, vLLM's PagedAttention below FlashInfer's; FlashInfer's README (github
  flashinfer-ai/flashinfer) puts its paged kernels at 90% of the bandwidth of dense ones. 0.70 is
  a choice inside that picture (the roofline presets' ``kv_eff``), not a figure read off a plot:
  an assumption, and the one to revisit first when decode-heavy cases miss.
- A40 (Ampere, like A100) takes A100's fractions; H200 (Hopper) takes H100's: derived, not measured.

Decode, ``backend.decode_attention``: ``flash`` (the default) is the 0.70 above, FlashAttention's
paged decoding, which vLLM runs on Ampere and Hopper from v0.4.3 (vllm-project/vllm#3648, "Use
flash-attn for decoding", merged after v0.4.1; #4907 restored it on 2024-05-19). ``vllm_paged`` is
vLLM's own PagedAttention kernel, its decode path before that (v0.2-v0.4.2). The FlashInfer
study cited above (flashinfer-ai/flashinfer-ai.github.io, _posts/2024-01-03-introduce-flashinfer.md,
figures 6 and 9: assets/imgs/batch-decode-benchmark.png and batch-gqa-benchmark.png) times vLLM 0.2.6's
PagedAttention v2 at 64 sequences a batch by context length, as the share of peak bandwidth of the
K/V bytes it must read: with one query head a K/V head (Llama-2-7B's shape, ``PAGED_MHA``) and with
eight (Llama-2-70B at TP 2, ``PAGED_GQA8``; 28% at most on H100, where FlashInfer's tensor-core
kernel reaches 89%). The study gives why: on CUDA cores "traditional implementation of Grouped
Query Attention is compute-bound", its work growing with the query heads, so with a group of g
query heads a K/V head the kernel runs at ``min(mha, 8 / g x gqa8)`` of the figures' rates:
memory-bound without grouping, compute-bound with eight. Read at the step's mean context,
with the 64-sequence curves for every batch (smaller batches run lower there: optimistic), held
at their last point past it; A100's are the figure's A100 PCIe, H200 takes H100's, A40 A100's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AttentionEff:
    prefill_flops: float  # fraction of peak FLOPs a long prompt's attention reaches
    decode_bandwidth: float  # fraction of peak bandwidth a decode's K/V gather reaches
    prefill_half_rate_tokens: float = 400.0  # the prompt length that reaches half of prefill_flops


# FlashAttention-2's forward pass on H100 SXM5, causal, head dimension 128: (tokens a sequence,
# TFLOP/s), read off the FlashAttention-3 paper's figure (see above); the test of the prefill
# rate checks the kernel model against these
FA2_H100_CAUSAL_TFLOPS = ((512, 191), (1024, 260), (2048, 298), (4096, 319), (8192, 333), (16384, 335))


DECODE_KERNELS = ("flash", "vllm_paged")

# vLLM 0.2.6's PagedAttention v2, 64 sequences a batch: (context tokens a sequence, share of peak
# bandwidth), read off FlashInfer's figures (see above; the points from 256 tokens measured on the
# images' pixels against their gridlines, the shorter ones by eye: +-2 points)
PAGED_MHA = {
    "h100": ((32, 0.28), (64, 0.44), (128, 0.58), (256, 0.69), (512, 0.77), (1024, 0.85)),
    "a100": ((32, 0.33), (64, 0.47), (128, 0.60), (256, 0.70), (512, 0.77), (1024, 0.80)),
}
PAGED_GQA8 = {
    "h100": ((32, 0.045), (64, 0.08), (128, 0.12), (256, 0.15), (512, 0.19), (1024, 0.23), (2048, 0.26),
             (4096, 0.28), (8192, 0.285)),
    "a100": ((32, 0.055), (64, 0.10), (128, 0.14), (256, 0.18), (512, 0.22), (1024, 0.24), (2048, 0.25),
             (4096, 0.26), (8192, 0.265)),
}  # fmt: skip
PAGED_CURVES = {"h100": "h100", "h200": "h100", "a100": "a100", "a40": "a100"}


def paged_decode_share(gpu: str, context: float, group: int) -> float:
    """The share of peak bandwidth vLLM's PagedAttention kernel reaches on ``gpu`` for decodes of
    ``context`` tokens with ``group`` query heads a K/V head (interpolated in log context)."""
    curves = PAGED_CURVES[gpu]

    def read(points: tuple[tuple[int, float], ...]) -> float:
        tokens, share = zip(*points)
        return float(np.interp(np.log2(max(context, 1.0)), np.log2(tokens), share))

    return min(read(PAGED_MHA[curves]), 8 / group * read(PAGED_GQA8[curves]))


ATTENTION_EFF = {
    "h100": AttentionEff(0.35, 0.70),
    "h200": AttentionEff(0.35, 0.70),
    "a100": AttentionEff(0.60, 0.70),
    "a40": AttentionEff(0.60, 0.70),
}


@dataclass(frozen=True)
class AttentionWork:
    """One layer's attention on one rank, split by kernel."""

    prefill_flops: float  # the causal (query, key) pairs' FLOPs
    prefill_row_flops: float  # one key position's FLOPs for every query row (the kernel's cost a row)
    prefill_bytes: float
    decode_flops: float
    decode_bytes: float
    decode_context: float  # the K/V tokens a decode reads, on average
    has_prefill: bool
    has_decode: bool


def attention_seconds(w: AttentionWork, eff: AttentionEff, peak: float, bandwidth: float, launch: float) -> float:
    """One layer's attention: each kernel the step runs is the slower of its FLOPs at the
    prefill efficiency and its bytes at the decode one, plus its launch; a prompt's kernel also
    pays ``prefill_half_rate_tokens / 2`` key positions' work a query row."""
    flops_rate, byte_rate = peak * eff.prefill_flops, bandwidth * eff.decode_bandwidth
    total = 0.0
    if w.has_prefill:
        flops = w.prefill_flops + eff.prefill_half_rate_tokens / 2 * w.prefill_row_flops
        total += launch + max(flops / flops_rate, w.prefill_bytes / byte_rate)
    if w.has_decode:
        total += launch + max(w.decode_flops / flops_rate, w.decode_bytes / byte_rate)
    return total
