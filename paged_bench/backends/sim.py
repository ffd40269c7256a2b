"""The simulated backend: no tokens computed, a step costs what its cost model says.

The default cost model is linear in what a step does, with defaults chosen so that the
seeds' workload lands near the seeds' engine (a few milliseconds per step plus a little
per sequence):

    duration = step_overhead + per_prefill_token * prefill tokens
             + per_decode_seq * decoding sequences + per_kv_token * K/V tokens read
             + per_swap_block * blocks swapped

``cost_model=roofline`` prices a step instead by its FLOPs and bytes for a model
(``backend.model``) on a hardware preset (``backend.hardware``: cpu, a100, h100, h200, b200, a40), and
``backend.preset=FILE`` replays a roofline calibrated against a real backend
(``python -m paged_bench.calibration.calibrate``); see ``paged_bench.costmodel.roofline``.
``cost_model=measured`` prices it from kernels timed on real GPUs (h100, a100, a40; h200
derived) plus the engine's per-step CPU work (``engine_cpu``), its all-reduces NCCL's or vLLM's own
kernel (``all_reduce``) and its decode attention FlashAttention's or vLLM's PagedAttention
(``decode_attention``); see ``paged_bench.costmodel.measured``. A roofline
knows its model and hardware, so it sizes the KV pool (``num_blocks=auto``, from
``gpu_memory_utilization``) and splits the model over ``tensor_parallel_size`` ranks whose
all-reduces cross ``interconnect`` (null: the hardware's own link).

Runs on virtual time, so a sweep of thousands of steps takes seconds and is bit-for-bit
reproducible; ``clock=wall`` paces it in real time instead.

Inside a multi-step window (``scheduler.num_scheduler_steps``) every step after the first
(``plan.window_step`` >= 1) is priced without the per-step overhead (``step_overhead``, a
roofline's ``overhead``, the measured model's engine CPU figure but its sampler's share): vLLM 0.6 schedules and prepares the inputs once per window.
The window's requests that ended inside it (``plan.idle_rows``) are priced as decodes: vLLM
computes its whole batch to the window's last step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from paged_bench.backends.base import Backend
from paged_bench.core.kv.base import Allocator
from paged_bench.core.plan import StepOutput, StepPlan
from paged_bench.costmodel.linear import LinearCost
from paged_bench.costmodel.measured.step import MeasuredCost, measured_cost
from paged_bench.costmodel.roofline import RooflineCost, load_preset
from paged_bench.costmodel.roofline import hardware as hardware_preset  # the option below shadows its name
from paged_bench.model.config import resolve_model
from paged_bench.sizing.kv_capacity import KVBudget

DEFAULT_VOCAB = 32000  # the ids a linear-cost run's workloads draw (a roofline takes its model's)


class SimBackend(Backend):
    name = "sim"
    clock = "virtual"
    reads_token_ids = False  # a cost model reads counts only: plans skip copying prompts
    computes_kv = False  # so a cluster may hand a request's (priced, not copied) K/V between replicas

    def __init__(
        self,
        *,
        step_overhead_ms: float = 3.0,
        per_prefill_token_ms: float = 0.4,
        per_decode_seq_ms: float = 0.5,
        per_kv_token_us: float = 1.0,
        per_swap_block_ms: float = 0.05,
        vocab_size: int | None = None,
        cost_model: Literal["linear", "roofline", "measured"] = "linear",
        hardware: str = "h100",
        model: str | Mapping[str, Any] = "llama-3-8b",
        model_path: str | None = None,
        dtype: str | None = None,
        preset: str | None = None,
        tensor_parallel_size: int = 1,
        interconnect: str | None = None,
        gpu_memory_utilization: float = 0.9,
        engine_cpu: str = "vllm_v0",
        all_reduce: str = "vllm_custom",
        decode_attention: str = "flash",
    ) -> None:
        super().__init__()  # its options are checked where the config is read (run.backend_options.SimOptions)
        self.vocab_size = DEFAULT_VOCAB if vocab_size is None else vocab_size
        tp = tensor_parallel_size
        self.gpu_memory_utilization = float(gpu_memory_utilization)
        self.roofline: RooflineCost | None = None
        self.measured: MeasuredCost | None = None
        if preset:
            self.roofline = replace(load_preset(preset), tp=tp, interconnect=interconnect)
        elif cost_model in ("roofline", "measured"):
            cfg = resolve_model(model, model_path)
            self.roofline = RooflineCost(cfg, hardware_preset(hardware), dtype or cfg.dtype, tp, interconnect)
            # measured kernels price the steps; the roofline still sizes the KV pool
            measured = cost_model == "measured"
            self.measured = measured_cost(self.roofline, engine_cpu, all_reduce, decode_attention) if measured else None
        self.num_devices = tp
        if self.roofline is not None:
            self.model_config = self.roofline.model  # its context bounds max_model_len, as a served model's
            # the ids a workload draws are the model's (a client's prompts for its server)
            self.vocab_size = self.roofline.model.vocab_size
            self.kv_bytes_per_token = self.roofline.shard.kv_bytes_per_token_all_ranks(self.roofline.dtype)
        self._block_size = 16
        self.cost = LinearCost(
            float(step_overhead_ms) / 1e3,
            float(per_prefill_token_ms) / 1e3,
            float(per_decode_seq_ms) / 1e3,
            float(per_kv_token_us) / 1e6,
            float(per_swap_block_ms) / 1e3,
        )

    def kv_budget(self, max_num_batched_tokens: int, max_num_seqs: int) -> KVBudget | None:
        if self.roofline is None:
            return None
        return self.roofline.kv_budget(self.gpu_memory_utilization, max_num_batched_tokens, max_num_seqs)

    def bind(self, allocator: Allocator) -> None:
        super().bind(allocator)
        self._block_size = allocator.layout.block_size

    def execute(self, plan: StepPlan) -> StepOutput:
        # each cost model prices a multi-step window's later steps itself (plan.window_step), and
        # its rows whose requests ended in it as the GPU computes them (plan.as_computed)
        # token 0 for every sample: deterministic, and the prefix cache still tells requests
        # apart because a block's hash chains over the whole prompt before it
        tokens, computed = [0] * len(plan.req_ids), plan.as_computed()
        if self.measured is not None:
            return StepOutput(tokens, self.measured.duration(computed, self._block_size))
        if self.roofline is not None:
            return StepOutput(tokens, self.roofline.duration(computed, self._block_size))
        return StepOutput(tokens, self.cost.duration(computed))
