"""Step replay: price every step a real run ran with a cost model, step by step.

A calibrated simulator can miss a real run's figures for two reasons: its cost model prices
steps wrong, or its run schedules different steps (a step that ends earlier admits a request
sooner, preempts less...). Comparing end-to-end figures mixes both. ``replay`` separates them:
it runs the real backend once, records every step's plan and measured duration (the engine's
step: scheduling, ``backend.execute`` and the update), then prices the very same plans with the
cost model. ``shape_table`` bins the pairs by step shape (decode batch sizes, prefill chunk
lengths, mixed steps), which shows which kind of step the model gets wrong and by how much.

    python benchmarks/sim_vs_numpy.py --replay --preset FILE
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from paged_bench.core.plan import StepOutput, StepPlan
from paged_bench.costmodel.roofline import RooflineCost
from paged_bench.run.bench import build


@dataclass(frozen=True)
class ReplayedStep:
    shape: str  # the bin: "decode 4", "prefill 1x<=128", "mixed 3+1x<=64"
    measured: float  # seconds the engine's step took
    predicted: float  # seconds the cost model gives its plan


@dataclass(frozen=True)
class Replay:
    steps: list[ReplayedStep]
    run_seconds: float  # the run's length (steps, the loop, idling to arrivals)
    num_preemptions: int


def shape_of(plan: StepPlan) -> str:
    """A plan's bin: decode batches by size; prompt chunks by count, length and the context the
    longest one follows (each rounded up to a power of 2): a chunk's attention grows with both,
    and a model can price one and miss the other (the Azure window's 512-token chunks: priced
    short after 0-512 tokens, long after 2,048-4,096, docs/backends.md)."""
    chunks = [(n, start) for n, start in zip(plan.num_new_tokens, plan.num_computed_tokens) if n > 1]
    if not chunks:
        return f"decode {len(plan.req_ids)}"
    longest, context = max(chunks)
    decodes = plan.num_decode_tokens
    kind = f"mixed {decodes}+" if decodes else "prefill "
    after = f"<={_power_of_2(context)}" if context else "0"
    return f"{kind}{len(chunks)}x<={_power_of_2(longest)} after {after}"


def _power_of_2(n: int) -> int:
    """The least power of 2 at least ``n`` (n >= 1)."""
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class Recorded:
    """A real run's plans, each with the duration its step took, to price with any cost model."""

    plans: list[StepPlan]
    measured: list[float]
    block_size: int
    run_seconds: float
    num_preemptions: int

    def priced(self, cost: RooflineCost) -> list[float]:
        """Each plan's seconds by ``cost``."""
        return [cost.duration(plan, self.block_size) for plan in self.plans]


def replay(cfg: Mapping[str, Any], cost: RooflineCost) -> Replay:
    """Run ``cfg`` (a real backend) once; price each step it ran with ``cost``."""
    run = record(cfg)
    steps = [ReplayedStep(shape_of(plan), measured, predicted)
             for plan, measured, predicted in zip(run.plans, run.measured, run.priced(cost), strict=True)]  # fmt: skip
    return Replay(steps, run.run_seconds, run.num_preemptions)


def record(cfg: Mapping[str, Any]) -> Recorded:
    """Run ``cfg`` (a real backend) once, recording each plan it ran and its step's duration."""
    bench = build(cfg)
    backend, block_size = bench.backend, bench.engine.allocator.layout.block_size
    plans: list[StepPlan] = []
    execute = backend.execute

    def recording(plan: StepPlan) -> StepOutput:  # the same backend, remembering each plan
        plans.append(plan)
        return execute(plan)

    backend.execute = recording  # type: ignore[method-assign]
    try:
        result = bench.engine.run(bench.requests, max_concurrency=bench.max_concurrency)
    finally:
        backend.close()
    # the engine records a step for every plan it executes, in order
    measured = [row.duration for row in result.steps.rows()]
    return Recorded(plans, measured, block_size, result.duration, result.num_preemptions)


def shape_table(steps: Sequence[ReplayedStep]) -> list[dict[str, Any]]:
    """Per shape bin: steps, median measured and predicted ms, the median of the per-step
    errors, and the bin's share of the measured busy time; largest share first."""
    busy = sum(s.measured for s in steps) or 1.0
    bins: dict[str, list[ReplayedStep]] = {}
    for step in steps:
        bins.setdefault(step.shape, []).append(step)
    rows = [
        {
            "shape": shape,
            "steps": len(group),
            "measured_ms": statistics.median(s.measured for s in group) * 1e3,
            "predicted_ms": statistics.median(s.predicted for s in group) * 1e3,
            "median_error": statistics.median(s.predicted / s.measured - 1 for s in group if s.measured > 0),
            "busy_share": sum(s.measured for s in group) / busy,
        }
        for shape, group in bins.items()
    ]
    return sorted(rows, key=lambda r: -r["busy_share"])
