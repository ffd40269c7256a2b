"""``backend=torch``: the same Llama-family transformer in torch, on CUDA or CPU.

``device=auto`` takes CUDA when present, else the CPU; ``dtype=auto`` is bfloat16 on CUDA
and float32 on the CPU (float16 and bfloat16 are GPU choices). Loads a local Hugging Face
checkpoint with ``backend.model_path=DIR`` (config.json + safetensors, and its tokenizer
when the folder has one), or random weights from the run's seed, identical to numpy's.
``threads`` sets torch's CPU threads while it runs (null: the job's share of the cores, see
``paged_bench.threads``); on cores shared with other work, 1 avoids threads waiting on each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from paged_bench.allocators.base import Allocator
from paged_bench.errors import check_int  # noqa: F401  (kept for the backend's own checks)
from paged_bench.model.config import ModelConfig
from paged_bench.model.ops_torch import DTYPES, TorchOps, pick_device, pick_dtype
from paged_bench.model.runner import ModelBackend
from paged_bench.step import StepOutput, StepPlan
from paged_bench.threads import job_threads


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
    ) -> None:
        self.device = pick_device(device)
        self.compute_dtype = pick_dtype(dtype, self.device)
        self.threads = job_threads("backend.threads", threads)  # null: this job's share of the cores
        self._saved_threads: int | None = None
        super().__init__(model=model, model_path=model_path, seed=seed)

    def make_ops(self, cfg: ModelConfig) -> TorchOps:
        return TorchOps(cfg, self.device, DTYPES[self.compute_dtype])

    def bind(self, allocator: Allocator) -> None:
        if self.threads is not None and self._saved_threads is None:
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            super().bind(allocator)  # allocates the pool and warms the kernels up

    def execute(self, plan: StepPlan) -> StepOutput:
        with torch.inference_mode():
            return super().execute(plan)

    def logits(self, plan: StepPlan) -> torch.Tensor:
        with torch.inference_mode():  # the pool is an inference tensor
            return super().logits(plan)

    def close(self) -> None:
        super().close()
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
