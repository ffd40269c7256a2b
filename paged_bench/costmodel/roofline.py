"""The simulator's roofline cost model: a step's FLOPs and bytes on a hardware preset.

A step runs two kinds of kernels one after the other, each bounded by its own roofline:

    duration = overhead + per_seq * sequences
             + max(matmul FLOPs / (peak_flops * compute_eff), weight bytes / (mem_bandwidth * memory_eff))
             + max(attention FLOPs / (peak_flops * attn_eff), K/V bytes / (mem_bandwidth * kv_eff))
             + per_token * new tokens (a calibrated CPU preset)
             + swap bytes / host_link
             + 2 x layers x all-reduce seconds (tensor parallel, over the ranks' link)

Matmul FLOPs: 2 x matmul weights per new token plus 2 x hidden x vocab per sampled row;
weight bytes: every matmul weight once per step (what makes decode memory-bound). Attention
FLOPs: 4 x heads x head_dim per (query, key) pair; K/V bytes: what every query reads plus
what the step writes. ``overhead``, ``per_seq`` and the four efficiencies are what
``calibrate`` fits to a real backend; the shipped presets carry datasheet peaks and typical
values for them. A calibrated preset also carries its backend's matmul seconds measured by
row count (``matmul_curve``), which then replace the matmul roofline (one rank only).

With ``tp`` ranks every figure is one rank's (``TPShard``: its slice of the weights, heads and
KV heads), the ranks run in parallel, and each layer adds two all-reduces of the step's
``tokens x hidden`` activations on the hardware's link (``tp_link``). ``memory_bytes`` is what
``num_blocks=auto`` sizes the KV pool from (``kv_capacity``).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from paged_bench.core.plan import StepPlan
from paged_bench.costmodel.step_work import StepWork, step_work
from paged_bench.costmodel.tp_link import Link, link_preset
from paged_bench.errors import ConfigError, check, check_choice
from paged_bench.model.config import ModelConfig
from paged_bench.sizing.kv_capacity import KVBudget, kv_budget
from paged_bench.sizing.tp_shard import TPShard, tp_shard


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # FLOP/s at the model's dtype (dense)
    mem_bandwidth: float  # bytes/s
    host_link: float  # bytes/s between device and host memory (swap)
    overhead: float = 0.0  # seconds per step (launches, scheduling, the framework)
    per_seq: float = 0.0  # seconds per scheduled sequence (batch bookkeeping)
    compute_eff: float = 1.0  # reachable fraction of peak_flops in the matmuls
    memory_eff: float = 1.0  # ... of mem_bandwidth streaming the weights
    attn_eff: float = 1.0  # ... of peak_flops in attention
    kv_eff: float = 1.0  # ... of mem_bandwidth gathering K/V through block tables
    memory_bytes: float | None = None  # device memory: the total vLLM sizes from (torch.cuda.mem_get_info)
    link: str = "shm"  # how its tensor-parallel ranks talk (a tp_link preset)
    # seconds per new token beyond its matmuls: the elementwise work of a forward on each token
    # row (norms, rotary, activations, residual adds), which a measured matmul curve leaves out
    # and per_seq covers only for decodes (one token a sequence); 0 in the GPU presets
    per_token: float = 0.0
    # an eager attention (the numpy/torch backends, what calibrate fits) gathers each group's
    # K/V padded to its longest context: the padding is read at the K/V rate too
    eager_attention: bool = False
    # measured matmul seconds by the step's token count, (tokens, every layer's matmuls, the LM
    # head on that many rows), ascending: replaces the matmul roofline where a calibration
    # found one. A CPU BLAS at one thread is no roofline for the few rows of a decode step:
    # one row runs a matrix-vector kernel, 2 and 3 rows a matrix-matrix kernel's slow edge
    # cases that cost more than 4 rows (see ``calibrate_matmuls.matmul_rounds``)
    matmul_curve: tuple[tuple[float, float, float], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Datasheet peaks (dense bf16 tensor cores, HBM, PCIe host link); overhead and efficiencies
# are typical for a well-tuned engine, to be replaced by a calibrated preset where one exists.
# ``cpu`` is this project's 2-core CI machine, measured (fp32 GEMM, copy bandwidth); it has
# no memory figure, so num_blocks=auto keeps max_batch full sequences there. GPU memory is what
# vLLM sizes from and logs as total_gpu_memory (torch.cuda.mem_get_info's total, to 0.01 GiB) on
# the 80 GB A100 and H100, the 141 GB H200 and the 192 GB B200: less than nvidia-smi's figure
# (H100 81,559 MiB = 79.65 GiB), which counts memory the driver keeps. Links are the SXM boards'
# NVLink (``backend.interconnect=pcie5`` etc. for PCIe cards).
_GPU = {"per_seq": 2e-5, "compute_eff": 0.6, "memory_eff": 0.8, "attn_eff": 0.3, "kv_eff": 0.7}
_GIB = 1 << 30
HARDWARE: dict[str, Hardware] = {
    "cpu": Hardware(
        "cpu",
        100e9,
        30e9,
        30e9,
        overhead=1e-3,
        per_seq=5e-5,
        compute_eff=0.5,
        memory_eff=0.5,
        attn_eff=0.2,
        kv_eff=0.3,
    ),
    "a100": Hardware("a100", 312e12, 2.04e12, 25e9, overhead=4e-3, **_GPU, memory_bytes=79.15 * _GIB, link="nvlink3"),
    "h100": Hardware("h100", 989e12, 3.35e12, 50e9, overhead=3e-3, **_GPU, memory_bytes=79.19 * _GIB, link="nvlink4"),
    "h200": Hardware("h200", 989e12, 4.8e12, 50e9, overhead=3e-3, **_GPU, memory_bytes=139.72 * _GIB, link="nvlink4"),
    "b200": Hardware("b200", 2.25e15, 8e12, 50e9, overhead=3e-3, **_GPU, memory_bytes=178.35 * _GIB, link="nvlink5"),
    # A40 (PCIe card, GDDR6; NVIDIA A40 datasheet: 149.7 TFLOPs dense bf16, 696 GB/s, 48 GB): one of
    # the GPUs with kernel profiles (cost_model=measured). Memory: nvidia-smi's 46,068 MiB less the
    # driver's share as on the H100 (0.46 GiB), an estimate
    "a40": Hardware("a40", 149.7e12, 696e9, 25e9, overhead=4e-3, **_GPU, memory_bytes=44.53 * _GIB, link="pcie4"),
}


def hardware(name: str, key: str = "backend.hardware") -> Hardware:
    return HARDWARE[check_choice(key, name, HARDWARE)]


def measure_cpu(seconds: float = 1.0, nbytes: int = 512 << 20) -> Hardware:
    """This machine's fp32 matmul rate and copy bandwidth (read + write), measured now with
    numpy; ``nbytes`` must be well beyond the last-level cache."""
    n = 1024
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.copy()
    flops = _best_rate(lambda: a @ b, 2 * n**3, seconds / 2)
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    bandwidth = _best_rate(lambda: np.copyto(dst, src), 2 * src.nbytes, seconds / 2)
    return Hardware("measured-cpu", flops, bandwidth, bandwidth / 2)


def _best_rate(fn, work: float, seconds: float) -> float:
    fn()
    best, end = float("inf"), time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() > end:
            return work / best


@dataclass(frozen=True)
class RooflineCost:
    model: ModelConfig
    hardware: Hardware
    dtype: str
    tp: int = 1  # tensor-parallel ranks
    interconnect: str | None = None  # a tp_link preset; None = the hardware's

    def __post_init__(self) -> None:
        tp_shard(self.model, self.tp)  # a one-line error when the model does not split
        link_preset(self.interconnect or self.hardware.link)

    @property
    def shard(self) -> TPShard:
        return TPShard(self.model, self.tp)

    @property
    def link(self) -> Link:
        return link_preset(self.interconnect or self.hardware.link)

    def kv_budget(self, gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int) -> KVBudget:
        """How much KV one rank holds, as vLLM sizes its pool (``kv_capacity``)."""
        return kv_budget(
            self.shard, self.dtype, self.hardware.memory_bytes, self.hardware.name,
            gpu_memory_utilization, max_num_batched_tokens, max_num_seqs,
        )  # fmt: skip

    def matmul_seconds(self, w: StepWork) -> float:
        hw = self.hardware
        if hw.matmul_curve is not None and self.tp == 1:
            return curve_seconds(hw.matmul_curve, w.num_tokens, w.num_seqs)
        return max(
            w.matmul_flops / (hw.peak_flops * hw.compute_eff), w.weight_bytes / (hw.mem_bandwidth * hw.memory_eff)
        )

    def seconds(self, w: StepWork) -> float:
        hw = self.hardware
        matmuls = self.matmul_seconds(w)
        kv_bytes = w.kv_bytes + w.padding_kv_bytes if hw.eager_attention else w.kv_bytes
        attention = max(w.attn_flops / (hw.peak_flops * hw.attn_eff), kv_bytes / (hw.mem_bandwidth * hw.kv_eff))
        comm = w.num_allreduces * self.link.allreduce_seconds(w.allreduce_bytes, self.tp) if w.num_allreduces else 0.0
        per_request = hw.per_seq * w.num_seqs + hw.per_token * w.num_tokens
        return hw.overhead + per_request + matmuls + attention + w.swap_bytes / hw.host_link + comm

    def duration(self, plan: StepPlan, block_size: int) -> float:
        """The seconds of ``plan`` (``seconds`` of its ``step_work``)."""
        seconds = self.seconds(step_work(plan, self.model, self.dtype, block_size, self.shard))
        if plan.window_step:  # a multi-step window's later step: the scheduler and its CPU work are skipped
            seconds -= self.hardware.overhead
        return seconds

    def with_fit(self, **coefficients: float) -> RooflineCost:
        return replace(self, hardware=replace(self.hardware, **coefficients))


def curve_seconds(curve: tuple[tuple[float, float, float], ...], tokens: int, rows: int) -> float:
    """A measured matmul curve read at ``tokens`` layer rows and ``rows`` LM-head rows:
    interpolated between its points, extended along its last two past the end."""
    xs = [p[0] for p in curve]

    def read(x: float, col: int) -> float:
        if x <= 0:
            return 0.0
        if x <= xs[-1]:
            return float(np.interp(x, xs, [p[col] for p in curve]))
        (x0, *a), (x1, *b) = curve[-2], curve[-1]
        return b[col - 1] + (b[col - 1] - a[col - 1]) * (x - x1) / (x1 - x0)

    return read(tokens, 1) + read(rows, 2)


def save_preset(path: Path, cost: RooflineCost, info: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"model": asdict(cost.model), "dtype": cost.dtype, "hardware": cost.hardware.to_dict(), **info}
    path.write_text(json.dumps(data, indent=2) + "\n")


def load_preset(path: str | Path) -> RooflineCost:
    p = Path(path)
    check(p.is_file(), "backend.preset", str(path), "a preset file written by python -m paged_bench.calibration.calibrate")
    try:
        data = json.loads(p.read_text())
        hw = data["hardware"]
        _check_no_removed_terms(hw, str(path))
        hw = {k: v for k, v in hw.items() if k not in (*REMOVED_TERMS, *REMOVED_FIGURES)}
        if hw.get("matmul_curve") is not None:
            hw = {**hw, "matmul_curve": tuple(tuple(float(v) for v in p) for p in hw["matmul_curve"])}
        cost = RooflineCost(ModelConfig(**data["model"]), Hardware(**hw), data["dtype"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError("backend.preset", str(path), f"a calibration preset ({type(e).__name__}: {e})") from e
    _check_hardware(cost.hardware, str(path))
    return cost


# terms calibration once fitted and no longer does: none moved a named case's replayed busy time
# by more than 2% (benchmarks/term_evidence.py; docs/backends.md, "Which terms the CPU cost model keeps")
REMOVED_TERMS = (
    "per_prefill", "per_attention_group", "per_spilled_kv_byte", "cold_step",
    "per_score_byte", "per_llc_spilled_byte", "per_heap_growth_byte", "per_scattered_block",
)  # fmt: skip
# the figures those terms were counted with: a preset may hold any value of them
REMOVED_FIGURES = ("cache_bytes", "llc_bytes", "heap_bytes_per_score_byte", "score_slice_elements")


def _check_no_removed_terms(hw: dict[str, Any], path: str) -> None:
    """A preset written before a term's removal loads if it left the term at 0, else is refused
    (priced without it, its other terms, fitted beside it, would be off)."""
    kept = [k for k in REMOVED_TERMS if hw.get(k)]
    check(not kept, "backend.preset", path, f"a preset without the removed terms {', '.join(kept)} (calibrate again: "
                                            "python -m paged_bench.calibration.calibrate)")  # fmt: skip


# rates and efficiencies that divide a step's work: 0 would be a ZeroDivisionError mid-run
_DIVISORS = ("peak_flops", "mem_bandwidth", "host_link", "compute_eff", "memory_eff", "attn_eff", "kv_eff")


def _check_hardware(hw: Hardware, path: str) -> None:
    """A preset's figures are finite and not negative (a negative bandwidth lost its term to
    ``max`` and the run priced steps at a third of their cost), its divisors above 0."""
    for f in fields(Hardware):
        value = getattr(hw, f.name)
        if f.name in ("name", "link", "matmul_curve", "eager_attention") or value is None:
            continue  # the link is checked as the cost is made; a curve's values were cast to floats
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (value > 0 if f.name in _DIVISORS else value >= 0)
        check(ok, "backend.preset", path, f"a calibration preset whose hardware.{f.name} is a finite number "
                                          f"{'> 0' if f.name in _DIVISORS else '>= 0'} (it holds {value!r})")  # fmt: skip
    check(isinstance(hw.eager_attention, bool), "backend.preset", path,
          f"a calibration preset whose hardware.eager_attention is true or false (it holds {hw.eager_attention!r})")
