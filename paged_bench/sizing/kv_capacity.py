"""How many tokens of KV fit on a device next to the model: ``num_blocks=auto``, as vLLM sizes it.

vLLM (v1 ``gpu_worker.determine_available_memory``) runs one dummy forward of
``max_num_batched_tokens`` tokens and keeps for the KV cache what the rest leaves of its share
of the device:

    requested  = ceil(total memory x gpu_memory_utilization)
    KV bytes   = requested - (weights + activation peak + non-torch memory)
    KV tokens  = KV bytes // KV bytes per token          (per rank: its share of the KV heads)
    KV blocks  = KV tokens // block_size

Here nothing is profiled: the weights are the rank's share of the model (``TPShard``); the
activation peak is the MLP's working set of that forward (the residual stream, its norm,
gate/up and SiLU x up: ``tokens x (2 hidden + 3 intermediate / tp)`` values) plus the
sampler's float32 logits for ``max_num_seqs`` rows; non-torch memory (cuBLAS workspaces, NCCL
buffers) is a flat 512 MiB. The CUDA context sits in the 10% that ``gpu_memory_utilization``
leaves, as in vLLM.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from paged_bench.errors import ConfigError, check
from paged_bench.model.config import DTYPE_BYTES
from paged_bench.sizing.tp_shard import KEY as TP_KEY
from paged_bench.sizing.tp_shard import TPShard, split_problem

NON_TORCH_BYTES = 512 << 20
_GIB = 1 << 30


@dataclass(frozen=True)
class KVBudget:
    """One rank's memory, term by term (bytes)."""

    hardware: str
    memory: int
    gpu_memory_utilization: float
    tensor_parallel_size: int
    weights: int
    activations: int
    non_torch: int
    kv_bytes_per_token: int

    @property
    def requested(self) -> int:
        return math.ceil(self.memory * self.gpu_memory_utilization)

    @property
    def kv_bytes(self) -> int:
        return self.requested - self.weights - self.activations - self.non_torch

    @property
    def tokens(self) -> int:
        return max(0, self.kv_bytes) // self.kv_bytes_per_token

    def blocks(self, block_size: int) -> int:
        return self.tokens // block_size

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kv_bytes": self.kv_bytes, "kv_capacity_tokens": self.tokens}

    def describe(self, block_size: int) -> str:
        g = _GIB
        return (
            f"{self.hardware}: {self.memory / g:.2f} GiB x {self.gpu_memory_utilization} = {self.requested / g:.2f} GiB"
            f" - weights {self.weights / g:.2f} GiB (per rank of {self.tensor_parallel_size})"
            f" - activations {self.activations / g:.2f} GiB - non-torch {self.non_torch / g:.2f} GiB"
            f" = {self.kv_bytes / g:.2f} GiB of KV / {self.kv_bytes_per_token:,} bytes per token"
            f" = {self.tokens:,} tokens = {self.blocks(block_size):,} blocks of {block_size}"
        )


def check_utilization(value: float) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1
    check(ok, "backend.gpu_memory_utilization", value, "a fraction in (0, 1]")
    return float(value)


def activation_bytes(shard: TPShard, dtype: str, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    m = shard.model
    mlp = max_num_batched_tokens * (2 * m.hidden_size + 3 * shard.intermediate_size) * DTYPE_BYTES[dtype]
    # float32 logits of the whole vocabulary on every rank: vLLM gathers them to all ranks
    logits = min(max_num_batched_tokens, max_num_seqs) * m.vocab_size * 4
    return mlp + logits


def _budget(shard: TPShard, dtype: str, memory: float, hardware: str, util: float, tokens: int, seqs: int) -> KVBudget:
    return KVBudget(
        hardware, int(memory), util, shard.size, shard.weight_bytes(dtype),
        activation_bytes(shard, dtype, tokens, seqs), NON_TORCH_BYTES, shard.kv_bytes_per_token(dtype),
    )  # fmt: skip


def kv_budget(
    shard: TPShard,
    dtype: str,
    memory: float | None,
    hardware: str,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> KVBudget | None:
    """None when the device's memory is unknown; a one-line error suggesting more ranks when
    the model leaves no room for KV."""
    if memory is None:
        return None
    util = check_utilization(gpu_memory_utilization)
    budget = _budget(shard, dtype, memory, hardware, util, max_num_batched_tokens, max_num_seqs)
    if budget.kv_bytes < budget.kv_bytes_per_token:
        _check_activations_leave_room(budget, shard.model.vocab_size, max_num_batched_tokens, max_num_seqs)
        fits = _smallest_fitting(shard, dtype, memory, hardware, util, max_num_batched_tokens, max_num_seqs)
        short = (f"{budget.weights / _GIB:.1f} GiB of weights per rank leave no KV space in "
                 f"{budget.requested / _GIB:.1f} GiB ({util} of one {hardware}'s {memory / _GIB:.1f} GiB)")  # fmt: skip
        if fits is None:  # no rank count helps: the share of the device is what is too small
            raise ConfigError("backend.gpu_memory_utilization", util,
                              f"a larger share: {short} at every tensor_parallel_size the model's heads allow")  # fmt: skip
        raise ConfigError(TP_KEY, shard.size, f"{short}; try backend.tensor_parallel_size={fits}")
    return budget


def _check_activations_leave_room(budget: KVBudget, vocab_size: int, tokens: int, seqs: int) -> None:
    """Where the weights alone leave KV space, the activations take it: name the knob that sizes
    the larger part of them (the step's tokens, or the sequences whose logits it holds)."""
    if budget.requested - budget.weights - budget.non_torch < budget.kv_bytes_per_token:
        return  # the weights are the problem: more ranks, or a larger share
    logits = min(tokens, seqs) * vocab_size * 4
    key, value = ("max_batch", seqs) if seqs < tokens and 2 * logits > budget.activations else (
        "max_num_batched_tokens", tokens)  # fmt: skip
    raise ConfigError(key, value, f"a smaller value: {budget.activations / _GIB:,.1f} GiB of activations per step "
                      f"beside {budget.weights / _GIB:.1f} GiB of weights per rank leave no KV space in "
                      f"{budget.requested / _GIB:.1f} GiB of one {budget.hardware}")  # fmt: skip


def _smallest_fitting(shard: TPShard, dtype: str, *args: Any) -> int | None:
    m = shard.model
    for size in range(shard.size + 1, m.num_heads + 1):
        if split_problem(m, size):
            continue
        b = _budget(TPShard(m, size), dtype, *args)
        if b.kv_bytes >= b.kv_bytes_per_token:
            return size
    return None
