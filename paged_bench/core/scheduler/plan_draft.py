"""The step a scheduler is planning (``PlanDraft``): the rows it has scheduled so far, the
token budget left, and the admissions, swaps and preemptions it decided. A policy's hooks
read it; the scheduler freezes it into the ``StepPlan`` the backend sees
(``paged_bench.core.plan``), whose columns it derives from the rows."""

from __future__ import annotations

from paged_bench.core.plan import NewRequestData, ReqId
from paged_bench.core.request import Request


class PlanDraft:
    """The step being planned; the policy hooks see it, the backend sees its frozen plan."""

    __slots__ = ("budget", "new_block_ids", "new_reqs", "num_new_tokens", "preempted", "reqs", "swap_in", "swap_out")

    def __init__(self, budget: int) -> None:
        self.budget = budget  # tokens the step may still take
        self.reqs: list[Request] = []  # scheduled, in batch order
        self.num_new_tokens: list[int] = []  # each one's tokens this step, from its num_computed_tokens on
        self.new_reqs: list[NewRequestData] = []  # admitted: the backend gets their data once
        self.new_block_ids: dict[ReqId, tuple[int, ...]] = {}  # blocks appended to known tables
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.preempted: list[Request] = []

    @property
    def num_preempted(self) -> int:
        return len(self.preempted)

    def add(self, req: Request, n: int, new_blocks: tuple[int, ...] = ()) -> None:
        """Schedule ``n`` new tokens of ``req``, for which its table (known to the backend)
        grew by ``new_blocks``."""
        self.reqs.append(req)
        self.num_new_tokens.append(n)
        self.budget -= n
        if new_blocks:
            self.new_block_ids[req.request_id] = new_blocks

    def unschedule(self, req: Request) -> None:
        """Take ``req`` back out of this step, if it was scheduled (it was preempted), and give
        its tokens back to the budget."""
        if req in self.reqs:
            i = self.reqs.index(req)
            del self.reqs[i]
            self.budget += self.num_new_tokens.pop(i)
            self.new_block_ids.pop(req.request_id, None)
