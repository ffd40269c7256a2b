"""What passes between scheduler, backend and engine in one step: the plan and its output."""

from __future__ import annotations

from dataclasses import dataclass, field

from paged_bench.request import Request


@dataclass(slots=True)
class StepPlan:
    """The scheduler's decision for one step.

    ``reqs[i]`` computes ``num_new_tokens[i]`` more tokens, starting at its
    ``num_computed_tokens``; it samples a token if that reaches its ``num_tokens``. Swap
    copies (block pairs) are done before the step computes anything.
    """

    budget: int  # tokens the step may still take
    reqs: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (gpu block, cpu block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu block, gpu block)
    num_preempted: int = 0

    def unschedule(self, req: Request) -> None:
        """Take ``req`` back out of this step (it was preempted after being scheduled)."""
        for i, r in enumerate(self.reqs):
            if r is req:
                self.budget += self.num_new_tokens.pop(i)
                del self.reqs[i]
                return

    @property
    def num_decode_tokens(self) -> int:
        """One-token chunks: decodes (a one-token prompt's prefill is counted here too)."""
        return self.num_new_tokens.count(1)


@dataclass(slots=True)
class StepOutput:
    """What a backend returns: one sampled token per scheduled request (ignored for a prefill
    chunk that does not reach the end of its prompt), and, for a virtual-time backend, how
    long the step takes in seconds."""

    token_ids: list[int]
    duration: float = 0.0
