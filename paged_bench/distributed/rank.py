"""One rank's slice of the model, and the messages rank 0 broadcasts to drive every rank.

Every rank builds the same weights (the checkpoint, or random ones from the seed) and keeps its
slice (``tp_shard``); its KV pool and swap space hold its KV heads for every slot, so the block
ids in a plan address the same slots on every rank. Each step rank 0 broadcasts the frozen
step plan itself; a worker rank keeps its own ``RequestStates`` from the plans (as rank 0's
backend does), does the plan's swap copies, builds the batch and runs its slice of the forward.
A request scheduled again carries no tokens in the plan, so the message also carries the tokens
rank 0 sampled at the previous forward, which the workers append before applying the new plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from paged_bench.backends.request_state import RequestState, RequestStates
from paged_bench.core.plan import StepPlan
from paged_bench.model.batch import StepBatch, build_batch, warmup_batch
from paged_bench.model.config import ModelConfig
from paged_bench.model.forward import Comm, forward
from paged_bench.model.ops_torch import DTYPES, TorchOps
from paged_bench.model.runner import swap_copies
from paged_bench.model.weights import fuse, make_state
from paged_bench.sizing.tp_shard import rank_config, shard_state, tp_shard


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
    block_size: int


@dataclass(frozen=True)
class Step:
    plan: StepPlan
    sampled: tuple[int, ...] | None  # rank 0's tokens of the previous forward's rows


@dataclass(frozen=True)
class Stop:
    pass


Message = Bind | Step | Stop


def rank_device(spec: ModelSpec, rank: int) -> torch.device:
    return torch.device(f"cuda:{rank}") if spec.device_type == "cuda" else torch.device("cpu")


class RankModel:
    """A rank's weights, KV pool and swap space, and its slice of the forward."""

    def __init__(self, spec: ModelSpec, rank: int, world_size: int) -> None:
        shard = tp_shard(spec.model, world_size)
        self.cfg = rank_config(shard)
        self.ops = TorchOps(self.cfg, rank_device(spec, rank), DTYPES[spec.dtype])
        state = shard_state(make_state(spec.model, spec.model_path, spec.seed), shard, rank)
        self.weights = fuse(state, self.cfg, self.ops.asarray, self.ops.asmatrix)
        self.pool: Any = None
        self.swap: Any = None
        self.block_size = 0
        self.comm: Comm | None = None  # set once the process group is up

    def bind(self, msg: Bind) -> None:
        with torch.inference_mode():
            self.pool = self.ops.new_pool(msg.num_slots)
            self.swap = self.ops.new_pool(msg.num_swap_slots, host=True)
            self.block_size = msg.block_size
            # every rank warms up together: the forward's all-reduces need them all
            self.forward(warmup_batch(min(16, msg.num_slots)))

    def forward(self, batch: StepBatch) -> torch.Tensor | None:
        """Logits on rank 0, None elsewhere."""
        with torch.inference_mode():
            return forward(self.ops, self.weights, self.cfg, self.pool, batch, self.comm)

    def swap_copies(self, plan: StepPlan) -> None:
        with torch.inference_mode():
            swap_copies(self.ops, self.pool, self.swap, plan, self.block_size)


class Follower:
    """A worker rank's run: request states kept from the plans alone, one forward per plan."""

    def __init__(self, model: RankModel) -> None:
        self.model = model
        self.states = RequestStates()
        self._unsampled: tuple[StepPlan, list[RequestState]] | None = None

    def step(self, msg: Step) -> None:
        if self._unsampled is not None and msg.sampled is not None:
            self.states.record_samples(*self._unsampled, list(msg.sampled))
        self._unsampled = None
        states = self.states.apply(msg.plan)
        self.model.swap_copies(msg.plan)
        if states:
            self.model.forward(build_batch(msg.plan, states, self.model.block_size))
            self._unsampled = (msg.plan, states)
