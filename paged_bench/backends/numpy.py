"""``backend=numpy``: a Llama-family transformer in plain numpy over the paged KV cache.

Random weights from the run's seed (``backend.model`` picks the shape: a preset such as
``small`` or a mapping of fields), or a local Hugging Face checkpoint
(``backend.model_path=DIR``). Runs on the wall clock; a step of the default ``small``
model costs a few milliseconds on two CPU cores. ``threads`` caps BLAS threads while the
backend runs: a decode step's small matmuls lose more to thread hand-offs (and to cores
shared with other work) than they gain from a second thread. While bound, freed temporaries
stay in the process for reuse (``model.heap``): else a step's cost depends on what glibc's
malloc happened to unmap before it (up to 40% on a long prompt chunk).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from threadpoolctl import threadpool_limits

from paged_bench.core.kv.base import Allocator
from paged_bench.model import heap
from paged_bench.model.config import ModelConfig
from paged_bench.model.ops_numpy import NumpyOps
from paged_bench.model.runner import ModelBackend


class NumpyBackend(ModelBackend):
    name = "numpy"

    def __init__(
        self,
        *,
        model: str | Mapping[str, Any] = "small",
        model_path: str | None = None,
        seed: int = 0,
        threads: int | None = 1,
        step_timer: str = "wall",
    ) -> None:
        self.threads = threads  # its options are checked where the config is read (run.backend_options)
        self._limits: Any = None
        self._holding = False  # freed memory held for reuse (model.heap) while bound
        super().__init__(model=model, model_path=model_path, seed=seed, step_timer=step_timer)

    def make_ops(self, cfg: ModelConfig) -> NumpyOps:
        return NumpyOps(cfg)

    def bind(self, allocator: Allocator) -> None:
        if self.threads is not None and self._limits is None:
            # process-wide until close(): a per-step switch costs more than a small step
            self._limits = threadpool_limits(self.threads, user_api="blas")
        if not self._holding:
            self._holding = heap.hold_freed_memory()
        super().bind(allocator)

    def close(self) -> None:
        super().close()
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None
        if self._holding:
            heap.release()
            self._holding = False
