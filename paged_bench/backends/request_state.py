"""What a real backend remembers of each request between steps, kept from the plans alone.

As a vLLM v1 worker's persistent batch: a request's tokens and block table arrive once (its
``NewRequestData``), then grow by the blocks the plan lists in ``new_block_ids`` and by the
tokens the backend itself samples; state goes when the plan says a request finished or was
preempted. So a backend (or a tensor-parallel rank fed the plan) never reads a live
``Request`` or asks the allocator for a table.
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_bench.core.plan import ReqId, SamplingParams, StepPlan


@dataclass(slots=True)
class RequestState:
    token_ids: list[int]
    num_prompt_tokens: int
    block_ids: list[int]
    sampling: SamplingParams


class RequestStates:
    def __init__(self) -> None:
        self.by_id: dict[ReqId, RequestState] = {}

    def apply(self, plan: StepPlan) -> list[RequestState]:
        """Bring the states up to ``plan``; returns the scheduled requests' states, in row order."""
        by_id = self.by_id
        for rid in plan.finished_req_ids:
            by_id.pop(rid, None)
        for rid in plan.preempted_req_ids:
            by_id.pop(rid, None)
        for new in plan.new_reqs:
            by_id[new.req_id] = RequestState(
                list(new.token_ids), new.num_prompt_tokens, list(new.block_ids), new.sampling
            )
        for rid, blocks in plan.new_block_ids.items():
            by_id[rid].block_ids.extend(blocks)
        return [by_id[rid] for rid in plan.req_ids]

    def record_samples(self, plan: StepPlan, states: list[RequestState], token_ids: list[int]) -> None:
        """Append each sampling row's token, as the scheduler does to its requests."""
        partial = plan.partial_rows
        for i, (state, token) in enumerate(zip(states, token_ids)):
            if i not in partial:
                state.token_ids.append(int(token))

    def clear(self) -> None:
        self.by_id.clear()
