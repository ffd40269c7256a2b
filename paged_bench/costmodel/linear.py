"""The simulator's default cost model: a step's seconds, linear in what the step does (see
``paged_bench.backends.sim``)."""

from __future__ import annotations

from dataclasses import dataclass

from paged_bench.core.plan import StepPlan


@dataclass(frozen=True)
class LinearCost:
    """Seconds per unit of work in a step."""

    step_overhead: float
    per_prefill_token: float
    per_decode_seq: float
    per_kv_token: float
    per_swap_block: float

    def duration(self, plan: StepPlan) -> float:
        decodes, scheduled = plan.num_decode_tokens, sum(plan.num_new_tokens)
        kv_read = scheduled + sum(plan.num_computed_tokens)
        # a multi-step window's later steps skip the scheduler: no per-step overhead
        overhead = 0.0 if plan.window_step else self.step_overhead
        return (
            overhead
            + self.per_prefill_token * (scheduled - decodes)
            + self.per_decode_seq * decodes
            + self.per_kv_token * kv_read
            + self.per_swap_block * (len(plan.swap_in) + len(plan.swap_out))
        )
