"""What a step does, counted from its plan: the work a cost model prices.

``step_work`` reads a ``StepPlan`` (rows, computed and new tokens, swaps) for a model and
dtype and counts FLOPs and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_bench.core.plan import StepPlan
from paged_bench.model.config import DTYPE_BYTES, ModelConfig
from paged_bench.sizing.tp_shard import TPShard


@dataclass(frozen=True)
class StepWork:
    """What a step does, in the units a roofline needs."""

    num_seqs: int
    matmul_flops: float
    weight_bytes: float
    attn_flops: float
    kv_bytes: float
    swap_bytes: float = 0.0
    num_allreduces: int = 0  # tensor parallel: two per layer
    allreduce_bytes: float = 0.0  # each one's activations
    num_tokens: int = 0  # new tokens: the rows of every layer's matmuls
    padding_kv_bytes: float = 0.0  # K/V an eager attention gathers past a request's end (its group's longest)


def step_work(
    plan: StepPlan, model: ModelConfig, dtype: str, block_size: int, shard: TPShard | None = None
) -> StepWork:
    """One rank's work (the whole model's when ``shard`` is None or of size 1)."""
    shard = shard or TPShard(model)
    kv_token = shard.kv_bytes_per_token(dtype)
    new = pairs = kv_read = 0
    decodes = decode_len = decode_read = 0
    for start, n in zip(plan.num_computed_tokens, plan.num_new_tokens):
        new += n
        pairs += n * start + n * (n + 1) // 2  # the query at position p sees keys 0..p
        kv_read += start + n
        if n == 1:
            decodes, decode_len, decode_read = decodes + 1, max(decode_len, start + 1), decode_read + start + 1
    # an eager attention (our numpy/torch backends) runs decodes as one group padded to the
    # longest context, masked keys included: it gathers K/V beyond what the requests hold (a
    # decode's one score per key is 1/head_dim of the K/V it gathers: the gather prices it).
    # Each prompt chunk runs alone, unpadded (``AttnGroup.each``)
    padding = decodes * decode_len - decode_read
    sampled = len(plan.req_ids)
    matmul = (
        2.0 * new * model.num_layers * shard.layer_matmul_params + 2.0 * sampled * model.hidden_size * shard.vocab_size
    )
    weights = float(shard.matmul_params * DTYPE_BYTES[dtype]) if plan.req_ids else 0.0
    attn = 4.0 * model.num_layers * shard.num_heads * model.head_dim * pairs
    swap = float((len(plan.swap_in) + len(plan.swap_out)) * block_size * kv_token)
    allreduces = 2 * model.num_layers if shard.size > 1 and new else 0
    return StepWork(
        num_seqs=len(plan.req_ids),
        matmul_flops=matmul,
        weight_bytes=weights,
        attn_flops=attn,
        kv_bytes=float((kv_read + new) * kv_token),
        swap_bytes=swap,
        num_allreduces=allreduces,
        allreduce_bytes=float(new * model.hidden_size * DTYPE_BYTES[dtype]),
        num_tokens=new,
        padding_kv_bytes=float(padding * kv_token),
    )
