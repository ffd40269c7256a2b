"""One rank's slice of the model, and the messages rank 0 broadcasts to drive every rank.

Every rank builds the same weights (the checkpoint, or random ones from the seed) and keeps its
slice (``tp_shard``); its KV pool and swap space hold its KV heads for every slot, so the block
ids of the allocator (in rank 0) address the same slots on every rank. A message is what the
step plan asks of a rank: allocate the pool, copy swapped blocks, run the forward over a batch
built from the plan. Only rank 0 gets logits back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from paged_bench.model.batch import StepBatch, warmup_batch
from paged_bench.model.config import ModelConfig
from paged_bench.model.forward import Comm, forward
from paged_bench.model.ops_torch import DTYPES, TorchOps
from paged_bench.model.tp_shard import rank_config, shard_state, tp_shard
from paged_bench.model.weights import fuse, make_state


@dataclass(frozen=True)
class ModelSpec:
    """What each rank builds its slice from (picklable: it crosses to the worker processes)."""

    model: ModelConfig
    model_path: str | None
    seed: int
    device_type: str  # cpu or cuda; rank r uses cuda:r
    dtype: str
    threads: int | None


@dataclass(frozen=True)
class Bind:
    num_slots: int
    num_swap_slots: int


@dataclass(frozen=True)
class Swap:
    to_host: bool  # True: pool -> swap space (a swap-out); False: swap space -> pool
    src_slots: np.ndarray
    dst_slots: np.ndarray


@dataclass(frozen=True)
class Forward:
    batch: StepBatch


@dataclass(frozen=True)
class Stop:
    pass


Message = Bind | Swap | Forward | Stop


def rank_device(spec: ModelSpec, rank: int) -> torch.device:
    return torch.device(f"cuda:{rank}") if spec.device_type == "cuda" else torch.device("cpu")


class RankModel:
    def __init__(self, spec: ModelSpec, rank: int, world_size: int) -> None:
        shard = tp_shard(spec.model, world_size)
        self.cfg = rank_config(shard)
        self.ops = TorchOps(self.cfg, rank_device(spec, rank), DTYPES[spec.dtype])
        state = shard_state(make_state(spec.model, spec.model_path, spec.seed), shard, rank)
        self.weights = fuse(state, self.cfg, self.ops.asarray, self.ops.asmatrix)
        self.pool: Any = None
        self.swap: Any = None
        self.comm: Comm | None = None  # set once the process group is up

    def handle(self, msg: Message) -> torch.Tensor | None:
        with torch.inference_mode():
            if isinstance(msg, Forward):
                return forward(self.ops, self.weights, self.cfg, self.pool, msg.batch, self.comm)
            if isinstance(msg, Swap):
                src, dst = (self.pool, self.swap) if msg.to_host else (self.swap, self.pool)
                self.ops.copy_slots(src, dst, msg.src_slots, msg.dst_slots)
            elif isinstance(msg, Bind):
                self.pool = self.ops.new_pool(msg.num_slots)
                self.swap = self.ops.new_pool(msg.num_swap_slots, host=True)
                # every rank warms up together: the forward's all-reduces need them all
                forward(self.ops, self.weights, self.cfg, self.pool, warmup_batch(min(16, msg.num_slots)), self.comm)
            return None
