"""``backend=torch``: the same Llama-family transformer in torch, on CUDA or CPU.

``device=auto`` takes CUDA when present, else the CPU; ``dtype=auto`` is bfloat16 on CUDA
and float32 on the CPU (float16 and bfloat16 are GPU choices). Loads a local Hugging Face
checkpoint with ``backend.model_path=DIR`` (config.json + safetensors, and its tokenizer
when the folder has one), or random weights from the run's seed, identical to numpy's.
``threads`` sets torch's CPU threads while it runs (null: the job's share of the cores, see
``paged_bench.run.threads``); on cores shared with other work, 1 avoids threads waiting on each other.

``tensor_parallel_size=N`` splits the model over N ranks, Megatron-style: this process is
rank 0 and spawns ranks 1..N-1 (``paged_bench.distributed``; gloo on CPU, NCCL on CUDA with
rank r on cuda:r); each holds its slice of the weights and of every KV slot's heads. Each
step rank 0 broadcasts the frozen step plan, every rank does its swap copies and its slice of
the forward from the plan alone, and rank 0 gathers the logits and samples. Each rank takes
``threads`` CPU threads (null: an equal share of the job's cores).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

from paged_bench.backends.base import Backend
from paged_bench.backends.request_state import RequestState
from paged_bench.core.kv.base import Allocator
from paged_bench.core.plan import StepOutput, StepPlan
from paged_bench.distributed.group import TPGroup
from paged_bench.distributed.rank import Bind, ModelSpec, Step
from paged_bench.errors import check, counted
from paged_bench.model.config import ModelConfig
from paged_bench.model.ops_torch import DTYPES, TorchOps, pick_device, pick_dtype
from paged_bench.model.runner import ModelBackend
from paged_bench.model.weights import Weights
from paged_bench.run.threads import cpu_share
from paged_bench.sizing.tp_shard import KEY as TP_KEY


class TorchBackend(ModelBackend):
    name = "torch"

    def __init__(
        self,
        *,
        model: str | Mapping[str, Any] = "small",
        model_path: str | None = None,
        seed: int = 0,
        device: str = "auto",
        dtype: str = "auto",
        threads: int | None = None,
        tensor_parallel_size: int = 1,
        step_timer: str = "wall",
    ) -> None:
        self.device = pick_device(device)
        self.compute_dtype = pick_dtype(dtype, self.device)
        # its options are checked where the config is read (run.backend_options.TorchOptions); its
        # device, dtype and ranks are checked here, against the machine's
        self.num_devices = tensor_parallel_size
        # null: the job's share of the cores, split over its ranks
        self.threads = max(1, cpu_share() // self.num_devices) if threads is None else threads
        if self.device.type == "cpu" and self.num_devices > 1 and self.num_devices * self.threads > cpu_share():
            # legal, and a way to study TP's traffic, but the timings are then the cores' queue
            cores = "one core" if cpu_share() == 1 else f"{cpu_share()} cores"
            print(f"note: {TP_KEY}={self.num_devices} ranks x {counted(self.threads, 'thread')} on this job's {cores}: "
                  "the ranks take turns on them and every step waits for the last; its timings say more about the "
                  "queue for the cores than about tensor parallelism", file=sys.stderr)  # fmt: skip
        if self.num_devices > 1:
            check(
                self.device.type == "cpu" or torch.cuda.device_count() >= self.num_devices,
                TP_KEY, tensor_parallel_size, f"at most the {torch.cuda.device_count()} CUDA devices here",
            )  # fmt: skip
        self.group: TPGroup | None = None  # the tensor-parallel ranks
        self._sampled: tuple[int, ...] | None = None  # the last forward's tokens, for the workers
        self._saved_threads: int | None = None
        super().__init__(model=model, model_path=model_path, seed=seed, step_timer=step_timer)

    def make_ops(self, cfg: ModelConfig) -> TorchOps:
        return TorchOps(cfg, self.device, DTYPES[self.compute_dtype])

    def make_weights(self, cfg: ModelConfig, model_path: str | None, seed: int) -> Weights:
        if self.num_devices == 1:
            return super().make_weights(cfg, model_path, seed)
        spec = ModelSpec(cfg, model_path, seed, self.device.type, self.compute_dtype, self.threads)
        self.group = TPGroup(spec, self.num_devices)
        self.ops = self.group.model.ops
        return self.group.model.weights  # rank 0's slice

    def bind(self, allocator: Allocator) -> None:
        if self.threads is not None and self._saved_threads is None:
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)
        if self.group is None:
            with torch.inference_mode():
                super().bind(allocator)  # allocates the pool and warms the kernels up
            return
        Backend.bind(self, allocator)  # not ModelBackend's: every rank allocates its share and warms up
        layout = allocator.layout
        self.group.bind(Bind(layout.num_slots, layout.num_cpu_blocks * layout.block_size, layout.block_size))
        self.pool, self.swap = self.group.model.pool, self.group.model.swap  # rank 0's share

    def execute(self, plan: StepPlan) -> StepOutput:
        with torch.inference_mode():
            if self.group is None:
                return super().execute(plan)
            with self.group.guard():
                # every rank sees every plan (its swaps, finished and preempted requests)
                self.group.send(Step(plan, self._sampled))
                out = super().execute(plan)  # rank 0's share: the same steps, on its slice
            self._sampled = tuple(out.token_ids) if plan.req_ids else None
            return out

    def logits(self, plan: StepPlan, states: list[RequestState]) -> torch.Tensor:
        with torch.inference_mode():  # the pool is an inference tensor
            if self.group is not None:
                return self.group.model.forward(self.batch(plan, states))
            return super().logits(plan, states)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        super().close()
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
