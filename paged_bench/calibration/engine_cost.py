"""What a real run pays per step outside the backend: the engine's own CPU work, measured.

A wall-clock run spends, besides the forward pass and sampling (``backend.execute``, what the
calibration shapes time), the engine's scheduling, block allocation and prefix hashing, the
update of every request, the step record and the run loop — on the same cores. A calibrated
simulator that leaves this out predicts steps that are too short, most visibly when steps are
short (small batches, small models). It is measured here by running the engine over a backend
that costs nothing (the sim at zero cost on virtual time) and reading the wall time per step
at a few batch sizes: ``per_step + per_seq * batch``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from paged_bench.core.clock import STEP_TIMERS
from paged_bench.run.bench import build
from paged_bench.run.compose import compose_config

FREE_SIM = ("backend=sim", "backend.step_overhead_ms=0", "backend.per_prefill_token_ms=0",
            "backend.per_decode_seq_ms=0", "backend.per_kv_token_us=0", "backend.per_swap_block_ms=0")  # fmt: skip


@dataclass(frozen=True)
class EngineCost:
    per_step: float  # seconds per engine step
    per_seq: float  # seconds per scheduled sequence


def measure_engine_cost(
    batch_sizes: Sequence[int] = (1, 4, 16, 32), output_len: int = 64, repeats: int = 3, step_timer: str = "wall"
) -> EngineCost:
    """The engine's seconds per step on ``step_timer`` (``core.clock.STEP_TIMERS``: what times the
    real runs it is added to), median of ``repeats`` runs per batch size, fitted as a line."""
    timer = STEP_TIMERS[step_timer]
    seconds = []
    for batch in batch_sizes:
        cfg = compose_config(*FREE_SIM, "workload=uniform", f"workload.num_requests={batch}", "workload.rate=inf",
                             "workload.prompt_len=64", f"workload.output_len={output_len}", f"max_batch={max(batch, 2)}",
                             "tracking.enabled=false")  # fmt: skip
        runs = []
        for _ in range(repeats):
            bench = build(cfg)
            start = timer()
            result = bench.engine.run(bench.requests)
            runs.append((timer() - start) / len(result.steps))
        seconds.append(statistics.median(runs))
    per_seq, per_step = np.polyfit(np.asarray(batch_sizes, float), np.asarray(seconds), 1)
    return EngineCost(max(float(per_step), 0.0), max(float(per_seq), 0.0))
