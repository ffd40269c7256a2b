"""What the built-in backends take from the ``backend`` section, typed and checked before one is
built (vLLM's ``ModelConfig`` and ``ParallelConfig``, as far as a backend's options name them):
the model a backend computes or prices, the simulator's cost model and hardware, a real
model's threads and ranks. A backend resolves the names checked here (a hardware preset, a
model) to build itself; what depends on the machine it runs on (a CUDA device) it checks there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from paged_bench.core.clock import STEP_TIMERS
from paged_bench.costmodel.measured.attention import DECODE_KERNELS
from paged_bench.costmodel.measured.collectives import ALL_REDUCE
from paged_bench.costmodel.measured.engine_cpu import ENGINE_CPU
from paged_bench.costmodel.measured.step import measured_cost
from paged_bench.costmodel.roofline import RooflineCost, hardware, load_preset
from paged_bench.costmodel.tp_link import link_preset
from paged_bench.errors import check, check_choice, check_int, check_number
from paged_bench.model.config import DTYPE_BYTES, ModelConfig, resolve_model
from paged_bench.run.plugin_options import PluginOptions
from paged_bench.run.threads import MAX_THREADS
from paged_bench.sizing.kv_capacity import check_utilization
from paged_bench.sizing.tp_shard import KEY as TP_KEY


@dataclass(frozen=True, kw_only=True)
class ModelSettings(PluginOptions):
    """The model a backend computes or prices: a preset name or a mapping of fields
    (``{preset: small, num_layers: 8}``), or a local checkpoint's config.json (``model_path``,
    which wins). Not ``model.config.ModelConfig``, the shape these resolve to."""

    model: str | Mapping[str, Any] = "small"
    model_path: str | None = None

    def model_config(self) -> ModelConfig:
        """The model's shape (ConfigError naming ``backend.model`` or ``model_path`` if there is none)."""
        return resolve_model(self.model, self.model_path)


COST_MODELS = ("linear", "roofline", "measured")


@dataclass(frozen=True, kw_only=True)
class SimOptions(ModelSettings):
    """``backend=sim``: a linear cost model's terms, or a roofline's model on a hardware preset
    (``cost_model=roofline``, or a calibrated ``preset``; ``cost_model=measured``: priced from
    measured kernels, ``costmodel.measured``, with the engine's CPU work ``engine_cpu``, its
    ``all_reduce`` and its ``decode_attention`` kernel) split over ``tensor_parallel_size``
    ranks, and the share of memory that sizes its KV pool. The roofline's names are checked
    whichever cost model reads them: a typo is never ignored."""

    step_overhead_ms: float = 3.0
    per_prefill_token_ms: float = 0.4
    per_decode_seq_ms: float = 0.5
    per_kv_token_us: float = 1.0
    per_swap_block_ms: float = 0.05
    vocab_size: int | None = None
    cost_model: Literal["linear", "roofline", "measured"] = "linear"
    hardware: str = "h100"
    model: str | Mapping[str, Any] = "llama-3-8b"
    dtype: str | None = None
    preset: str | None = None
    tensor_parallel_size: int = 1
    interconnect: str | None = None
    gpu_memory_utilization: float = 0.9
    engine_cpu: str = "vllm_v0"  # measured: the engine's per-step CPU work (vllm_v0, none)
    all_reduce: str = "vllm_custom"  # measured, TP: vLLM's own kernel for small messages, or NCCL's alone
    decode_attention: str = "flash"  # measured: FlashAttention's paged decoding, or vLLM's PagedAttention (vllm_paged)

    def __post_init__(self) -> None:
        if self.vocab_size is not None:
            check_int("backend.vocab_size", self.vocab_size, 2)
        check(self.cost_model in COST_MODELS, "backend.cost_model", self.cost_model, ", ".join(COST_MODELS))
        check_choice("backend.engine_cpu", self.engine_cpu, ENGINE_CPU)
        check_choice("backend.all_reduce", self.all_reduce, ALL_REDUCE)
        check_choice("backend.decode_attention", self.decode_attention, DECODE_KERNELS)
        check_int(TP_KEY, self.tensor_parallel_size)
        check_utilization(self.gpu_memory_utilization)
        hardware(self.hardware)
        if self.dtype is not None:
            check_choice("backend.dtype", self.dtype, DTYPE_BYTES)
        if self.interconnect is not None:
            link_preset(self.interconnect)
        model = self.roofline_model()
        check(model is not None or self.tensor_parallel_size == 1, TP_KEY, self.tensor_parallel_size,
              "1 with cost_model=linear (use cost_model=roofline or measured)")  # fmt: skip
        if model is not None:  # the ids a workload draws are the model's (a client's prompts for its server)
            check(self.vocab_size in (None, model.vocab_size), "backend.vocab_size", self.vocab_size,
                  f"null with a roofline: its model's, {model.vocab_size} (another: backend.model="
                  f"{{preset:NAME,vocab_size:N}})")  # fmt: skip
        if self.cost_model == "measured" and not self.preset:
            # the GPU and dtype have profiles
            measured_cost(self.measured_base(), self.engine_cpu, self.all_reduce, self.decode_attention)
        for key in ("step_overhead_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_kv_token_us",
                    "per_swap_block_ms"):  # fmt: skip
            check_number(f"backend.{key}", getattr(self, key))

    def roofline_model(self) -> ModelConfig | None:
        """The model a roofline prices (a preset's, else ``model``'s); None for the linear cost model."""
        if self.preset:
            return load_preset(self.preset).model
        return self.model_config() if self.cost_model in ("roofline", "measured") else None

    def measured_base(self) -> RooflineCost:
        """The model, hardware, dtype and TP split a measured cost model prices."""
        cfg = self.model_config()
        return RooflineCost(cfg, hardware(self.hardware), self.dtype or cfg.dtype, self.tensor_parallel_size,
                            self.interconnect)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class RealModelSettings(ModelSettings):
    """A real model's step timer on virtual time (``core.clock.STEP_TIMERS``): ``wall`` (elapsed
    time) or ``thread_cpu`` (the engine thread's CPU time, which other processes cannot stretch;
    ``clock=virtual`` and ``threads=1`` only, checked as the engine is built)."""

    step_timer: str = "wall"

    def __post_init__(self) -> None:
        check_choice("backend.step_timer", self.step_timer, STEP_TIMERS)


@dataclass(frozen=True, kw_only=True)
class NumpyOptions(RealModelSettings):
    """``backend=numpy``: the model, the seed of its random weights and sampling, and the BLAS
    threads it computes with (null: the library's default)."""

    seed: int = 0
    threads: int | None = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.threads is not None:
            check_int("backend.threads", self.threads)
        self.model_config()


@dataclass(frozen=True, kw_only=True)
class TorchOptions(RealModelSettings):
    """``backend=torch``: the model, its seed, device and dtype (resolved on the machine that
    runs it), its CPU threads (null: the job's share of the cores) and its tensor-parallel ranks."""

    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(TP_KEY, self.tensor_parallel_size)
        if self.threads is not None:
            check_int("backend.threads", self.threads, 1, MAX_THREADS)
        self.model_config()
