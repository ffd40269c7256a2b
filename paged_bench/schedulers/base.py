"""The scheduler protocol and the iteration-level machinery every policy shares.

Each step, ``schedule`` first gives every running request its next tokens (a decode, or the
next chunk of an unfinished prefill) under a per-step token budget, then admits waiting
requests while ``max_batch`` and the budget allow. A policy is a few hooks on top:

- ``may_admit``: may this step admit anyone (static batching: only when the batch is empty);
- ``pick_waiting``: which waiting request goes next (FCFS by default);
- ``choose_victim``: what to do when a running request cannot get a block (by default the run
  stops with ``PoolExhaustedError``; a preemptive policy names a victim instead);
- ``preemption_mode`` and ``admission_reserve_blocks``: how a victim is preempted, and how
  many blocks admission leaves free.

The scheduler asks the allocator for room and never touches blocks itself.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar, Literal

from paged_bench.allocators.base import Allocator
from paged_bench.errors import PoolExhaustedError, check, check_int
from paged_bench.request import FinishReason, Request, RequestStatus
from paged_bench.step import StepOutput, StepPlan

RUNNING = RequestStatus.RUNNING
LENGTH = FinishReason.LENGTH


class Scheduler:
    name: ClassVar[str] = ""
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    admission_reserve_blocks: int = 0

    def __init__(
        self,
        allocator: Allocator,
        *,
        max_model_len: int,
        max_batch: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool = True,
        eos_token_id: int | None = None,
    ) -> None:
        self.allocator = allocator
        self.max_model_len = check_int("max_model_len", max_model_len)
        self.max_batch = check_int("max_batch", max_batch)
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", max_num_batched_tokens)
        check(isinstance(chunked_prefill, bool), "scheduler.chunked_prefill", chunked_prefill, "true or false")
        check(
            chunked_prefill or max_num_batched_tokens >= max_model_len,
            "max_num_batched_tokens",
            max_num_batched_tokens,
            f">= max_model_len={max_model_len} when chunked_prefill is off (a prompt must fit one step)",
        )
        self.chunked_prefill = chunked_prefill
        self.eos_token_id = eos_token_id
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.recomputed_tokens = 0
        self.swapped_blocks = 0  # blocks copied between GPU and CPU, either way
        self._lost: dict[Request, int] = {}  # recompute-preempted request -> tokens it had computed

    # -- policy hooks ---------------------------------------------------------------------

    def may_admit(self, plan: StepPlan) -> bool:
        """No admissions in a step that preempted (the pool is short)."""
        return plan.num_preempted == 0

    def pick_waiting(self) -> Request:
        return self.waiting[0]

    def choose_victim(self, req: Request) -> Request:
        layout = self.allocator.layout
        raise PoolExhaustedError(
            f"KV pool exhausted: request {req.request_id} needs another block but all "
            f"{layout.num_blocks} blocks of {layout.block_size} tokens are held by "
            f"{len(self.running)} running requests; use scheduler=preemptive or a larger num_blocks"
        )

    # -- the protocol the engine uses -----------------------------------------------------

    def add_request(self, req: Request, now: float) -> None:
        if not 0 < req.num_prompt_tokens < self.max_model_len:
            req.finish(
                FinishReason.REJECTED,
                now,
                f"prompt of {req.num_prompt_tokens} tokens; allowed: 1 to {self.max_model_len - 1} "
                f"(max_model_len={self.max_model_len})",
            )
            return
        req.max_num_tokens = min(req.num_prompt_tokens + req.max_tokens, self.max_model_len)
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan(budget=self.max_num_batched_tokens)
        self._schedule_running(plan)
        if self.may_admit(plan):
            self._admit_waiting(plan, now)
        return plan

    def update(self, plan: StepPlan, output: StepOutput, now: float) -> list[Request]:
        """Advance the scheduled requests by the step's output; returns those that finished."""
        finished = []
        eos = self.eos_token_id
        for req, n, token in zip(plan.reqs, plan.num_new_tokens, output.token_ids):
            computed = req.num_computed_tokens + n
            req.num_computed_tokens = computed
            tokens = req.token_ids
            if computed < len(tokens):  # a prefill chunk short of the prompt's end: no sample
                continue
            tokens.append(token)
            req.token_times.append(now)
            if computed >= req.max_num_tokens - 1:  # now holds max_num_tokens tokens
                req.finish(LENGTH, now)
            elif token == eos and not req.ignore_eos:
                req.finish(FinishReason.STOP, now)
            else:
                continue
            finished.append(req)
        if finished:
            self.running = [r for r in self.running if r.status is RUNNING]
            for req in finished:
                self.allocator.free(req)
        return finished

    def add_prefilled(self, req: Request) -> bool:
        """Admit a request whose prompt K/V was computed on another replica and moved here
        (disaggregated prefill): it takes blocks for its prompt, counts the prompt as computed
        and runs from its next token. False, changing nothing, if ``max_batch`` or the pool
        (less the admission reserve) has no room for it now."""
        reserve = self.admission_reserve_blocks if self.running else 0
        prompt = req.num_prompt_tokens
        if len(self.running) >= self.max_batch:
            return False
        if not self.allocator.allocate_slots(req, prompt, min_free_blocks=reserve):
            return False
        req.num_computed_tokens = prompt
        req.max_num_tokens = min(prompt + req.max_tokens, self.max_model_len)
        req.status = RUNNING
        self.running.append(req)
        return True

    def finish_request(self, req: Request, reason: FinishReason, now: float, error: str | None = None) -> None:
        """End a request from outside the step loop (client abort, stop string, run error)."""
        if req.is_finished:
            return
        if req.status is RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.allocator.free(req)
        self._lost.pop(req, None)
        req.finish(reason, now, error)

    def abort_all(self, reason: FinishReason, now: float, error: str | None = None) -> list[Request]:
        """End every unfinished request; returns them."""
        aborted = [*self.running, *self.waiting]
        for req in aborted:
            self.finish_request(req, reason, now, error)
        return aborted

    # -- the machinery --------------------------------------------------------------------

    def _chunk(self, num_tokens: int, budget: int) -> int:
        """How many of ``num_tokens`` fit this step: all, the budget's worth, or none."""
        if num_tokens <= budget:
            return num_tokens
        return budget if self.chunked_prefill else 0

    def _schedule_running(self, plan: StepPlan, start: int = 0) -> None:
        # the hot path: one pass over the running requests per step, kept lean on purpose
        running, allocate, chunked = self.running, self.allocator.allocate_slots, self.chunked_prefill
        add_req, add_num_new, budget = plan.reqs.append, plan.num_new_tokens.append, plan.budget
        for req in running[start:] if start else running:
            if budget <= 0:
                break
            n = len(req.token_ids) - req.num_computed_tokens
            if n > budget:
                if not chunked:
                    continue
                n = budget
            if not allocate(req, n):
                # rare: preempt, then go on with the (changed) running list after req
                plan.budget = budget
                next_index = self._make_room(req, n, running.index(req), plan)
                return self._schedule_running(plan, next_index)
            add_req(req)
            add_num_new(n)
            budget -= n
        plan.budget = budget

    def _make_room(self, req: Request, n: int, i: int, plan: StepPlan) -> int:
        """Preempt until ``req`` (at ``running[i]``) gets its ``n`` slots, or is itself the
        victim; returns the index of the next running request to schedule."""
        while True:
            victim = self.choose_victim(req)
            victim_index = self.running.index(victim)
            self._preempt(victim, plan)
            if victim is req:
                return i
            if victim_index < i:
                i -= 1
            if self.allocator.allocate_slots(req, n):
                plan.reqs.append(req)
                plan.num_new_tokens.append(n)
                plan.budget -= n
                return i + 1

    def _admit_waiting(self, plan: StepPlan, now: float) -> None:
        allocator, waiting = self.allocator, self.waiting
        while waiting and len(self.running) < self.max_batch and plan.budget > 0:
            req = self.pick_waiting()
            if req.status is RequestStatus.SWAPPED:
                n = self._chunk(len(req.token_ids) - req.num_computed_tokens, plan.budget)
                pairs = allocator.swap_in(req, n) if n else None
                if pairs is None:
                    break
                plan.swap_in += pairs
                self.swapped_blocks += len(pairs)
            else:
                hit = allocator.lookup_prefix(req)
                n = self._chunk(len(req.token_ids) - hit.num_tokens, plan.budget)
                # an empty engine admits regardless of the reserve, or nothing could ever run
                reserve = self.admission_reserve_blocks if self.running else 0
                if n == 0 or not allocator.allocate_slots(req, n, hit, reserve):
                    break
                req.num_computed_tokens = hit.num_tokens
                lost = self._lost.pop(req, None)
                if lost is None:
                    req.num_cached_tokens = hit.num_tokens
                else:
                    self.recomputed_tokens += max(0, lost - hit.num_tokens)
            if req is waiting[0]:
                waiting.popleft()
            else:
                waiting.remove(req)
            req.status = RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            self.running.append(req)
            plan.reqs.append(req)
            plan.num_new_tokens.append(n)
            plan.budget -= n

    def _preempt(self, victim: Request, plan: StepPlan) -> None:
        """Take ``victim`` off the GPU and put it at the front of the waiting queue."""
        self.running.remove(victim)
        plan.unschedule(victim)
        plan.num_preempted += 1
        self.num_preemptions += 1
        victim.num_preemptions += 1
        pairs = self.allocator.swap_out(victim) if self.preemption_mode == "swap" else None
        if pairs is not None:
            victim.status = RequestStatus.SWAPPED
            plan.swap_out += pairs
            self.swapped_blocks += len(pairs)
        else:  # recompute (also when swap space is full): keep the tokens, drop the K/V
            self._lost[victim] = victim.num_computed_tokens
            self.allocator.free(victim)
            victim.num_computed_tokens = 0
            victim.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(victim)
