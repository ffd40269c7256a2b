"""The step a scheduler is planning (``PlanDraft``): the rows it has scheduled so far, the
token budget left, and the swaps and preemptions it decided. A policy's hooks read it; the
scheduler freezes it into the ``StepPlan`` the backend sees (``paged_bench.core.plan``)."""

from __future__ import annotations

from paged_bench.core.plan import NewRequestData, ReqId
from paged_bench.core.request import Request


class PlanDraft:
    """The step being planned; the policy hooks see it, the backend sees its frozen plan.
    (A plain slotted class: one is built every step.)"""

    __slots__ = (
        "budget",
        "new_block_ids",
        "new_reqs",
        "num_new_tokens",
        "num_prefill_rows_of_one_token",
        "partial_rows",
        "preempted",
        "req_ids",
        "reqs",
        "starts",
        "swap_in",
        "swap_out",
    )  # fmt: skip

    def __init__(self, budget: int) -> None:
        self.budget = budget  # tokens the step may still take
        self.reqs: list[Request] = []  # scheduled, in batch order; the plan's columns beside them
        self.req_ids: list[ReqId] = []
        self.starts: list[int] = []  # num_computed_tokens before the step
        self.num_new_tokens: list[int] = []
        self.new_reqs: list[NewRequestData] = []
        self.new_block_ids: dict[ReqId, tuple[int, ...]] = {}  # blocks appended to known tables
        self.partial_rows: list[int] = []
        self.num_prefill_rows_of_one_token = 0  # one-token rows that are not decodes
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.preempted: list[Request] = []

    @property
    def num_preempted(self) -> int:
        return len(self.preempted)

    def add(self, req: Request, n: int, new_blocks: tuple[int, ...] = ()) -> None:
        """Schedule ``n`` new tokens of ``req``, from its ``num_computed_tokens`` on, for which
        its table (known to the backend) grew by ``new_blocks``."""
        if new_blocks:
            self.new_block_ids[req.request_id] = new_blocks
        if n == 1 and req.num_computed_tokens < req.num_prompt_tokens:
            self.num_prefill_rows_of_one_token += 1
        if req.num_computed_tokens + n < len(req.token_ids):
            self.partial_rows.append(len(self.reqs))
        self.reqs.append(req)
        self.req_ids.append(req.request_id)
        self.starts.append(req.num_computed_tokens)
        self.num_new_tokens.append(n)
        self.budget -= n

    def unschedule(self, req: Request) -> None:
        """Take ``req`` back out of this step (it was preempted after being scheduled)."""
        for i, r in enumerate(self.reqs):
            if r is req:
                n = self.num_new_tokens.pop(i)
                del self.reqs[i], self.req_ids[i], self.starts[i]
                self.budget += n
                if n == 1 and req.num_computed_tokens < req.num_prompt_tokens:
                    self.num_prefill_rows_of_one_token -= 1
                self.partial_rows = [j - (j > i) for j in self.partial_rows if j != i]
                self.new_block_ids.pop(req.request_id, None)
                return
