"""The scheduler protocol and the iteration-level machinery every policy shares.

Each step, ``schedule`` first gives every running request its next tokens (a decode, or the
next chunk of an unfinished prefill) under a per-step token budget, then admits waiting
requests while ``max_batch`` and the budget allow, and returns a frozen ``StepPlan`` for the
backend (see ``paged_bench.core.plan``). A policy is a few hooks on top:

- ``may_admit``: may this step admit anyone (static batching: only when the batch is empty);
- ``pick_waiting``: which waiting request goes next (FCFS by default);
- ``choose_victim``: what to do when a running request cannot get a block (by default the run
  stops with ``PoolExhaustedError``; a preemptive policy names a victim instead);
- ``preemption_mode`` and ``admission_reserve_blocks``: how a victim is preempted, and how
  many blocks admission (and swap-in) leaves free.

Two options make steps as older vLLM did (docs/engine.md): ``prefill_first``, vLLM 0.x's
``_schedule_default`` (a step that admits prompts runs no decodes; off: v1's mixed steps), and
``num_scheduler_steps``, vLLM 0.6's multi-step (a plan of decodes alone runs that many steps).
The scheduler asks the allocator for room and never touches blocks itself."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar, Final, Literal, SupportsIndex

from mypy_extensions import mypyc_attr

from paged_bench.core.kv.base import Allocator
from paged_bench.core.plan import NewRequestData, ReqId, StepOutput, StepPlan, new_step_plan
from paged_bench.core.request import FinishReason, Request, RequestStatus, check_stop
from paged_bench.core.scheduler.plan_draft import PlanDraft
from paged_bench.errors import EngineError, PoolExhaustedError

_WAITING_STATES: Final = (RequestStatus.WAITING, RequestStatus.PREEMPTED, RequestStatus.SWAPPED)


def _hook_error(sched: Scheduler, hook: str, value: object, allowed: str) -> EngineError:
    """A policy hook's answer the machinery cannot act on: the run stops, naming the hook."""
    shown = f"request {value.request_id}" if isinstance(value, Request) else repr(value)[:80]
    return EngineError(f"scheduler {sched.name!r}: {hook}() returned {shown}, which is {allowed}")


@mypyc_attr(allow_interpreted_subclasses=True)  # every policy subclasses it, plugins too
class Scheduler:
    name: ClassVar[str] = ""
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    admission_reserve_blocks: int = 0
    plan_token_ids: bool = True  # new requests carry their tokens (the engine sets the backend's choice)

    def __init__(
        self,
        allocator: Allocator,
        *,  # checked before they get here, where the config is read (paged_bench.run.plugin_options)
        max_model_len: int,
        max_batch: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool = True,
        prefill_first: bool = False,
        num_scheduler_steps: int = 1,
        long_prefill_token_threshold: int = 0,
        eos_token_id: int | None = None,
        stop_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.allocator = allocator
        self.max_model_len = max_model_len
        self.max_batch = max_batch
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.prefill_first = prefill_first
        self.num_scheduler_steps = num_scheduler_steps
        # a request's most prompt tokens a step (vLLM v1's cap): a long prompt leaves budget to others
        self.long_prefill_token_threshold = long_prefill_token_threshold  # 0 = none (conf/serve.yaml: 256)
        # every id that ends a sequence (a checkpoint may name several): a set, so one test a row
        self.end_token_ids = frozenset(t for t in (eos_token_id, *stop_token_ids) if t is not None)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the tail is the last admitted
        self.num_preemptions = 0
        self.recomputed_tokens = 0
        self.swapped_blocks = 0  # blocks copied between GPU and CPU, either way
        self._lost: dict[Request, int] = {}  # recompute-preempted request -> tokens it had computed
        self._scheduled: list[Request] = []  # the last plan's rows, for update()
        self._finished_ids: list[ReqId] = []  # ended since the last plan was handed out
        self._preempted_ids: list[ReqId] = []  # preempted in a step that planned nothing to run
        self._handed_over: list[NewRequestData] = []  # admitted by add_prefilled since the last plan
        self._window: list[Request] = []  # multi-step: the batch of the window under way
        self._window_left = 0  # its steps still to run after the last plan
        self._window_done: list[Request] = []  # ended inside it: their blocks go at its end
        self.window_log: list[int] | None = None  # set to a list: each step's window_step, -1 if none

    # -- policy hooks ---------------------------------------------------------------------

    def may_admit(self, plan: PlanDraft) -> bool:
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

    # -- their answers, checked: a policy's mistake stops the run, naming the hook ---------
    # (each called through a Callable that returns object, so a wrong answer reaches the check as
    # given: compiled, a direct call would convert it to the declared type, a bare TypeError)

    def _admits(self, draft: PlanDraft) -> bool:
        may_admit: Callable[[PlanDraft], object] = self.may_admit
        answer = may_admit(draft)
        if answer not in (True, False):  # numpy's bools and 0/1 too; a forgotten return (None) is refused
            raise _hook_error(self, "may_admit", answer, "not a bool: return True or False")
        return bool(answer)

    def _next_waiting(self) -> Request:
        pick_waiting: Callable[[], object] = self.pick_waiting
        req = pick_waiting()
        if not (isinstance(req, Request) and req.status in _WAITING_STATES):
            raise _hook_error(self, "pick_waiting", req, "not waiting: return a waiting request")
        return req

    def _victim_for(self, req: Request) -> Request:
        choose_victim: Callable[[Request], object] = self.choose_victim
        victim = choose_victim(req)
        if not (isinstance(victim, Request) and victim.status is RequestStatus.RUNNING):
            raise _hook_error(self, "choose_victim", victim, "not running: return a running request")
        return victim

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
        req.cap_length(self.max_model_len)
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        """Requests to run, or a multi-step window's steps (run even if all its requests ended)."""
        return bool(self.waiting or self.running or self._window_left)

    def schedule(self, now: float) -> StepPlan:
        if self._window_left:  # multi-step: the batch stays as it is until the window ends
            plan = self._window_plan()
            if plan is not None:
                return plan
        if self._window:
            self._end_window()
        draft = PlanDraft(budget=self.max_num_batched_tokens)
        if self._handed_over:
            draft.new_reqs += self._handed_over
            self._handed_over = []
        if not self.prefill_first:  # mixed: running first, then prompts in what the budget has left
            self._schedule_running(draft)
            if self._admits(draft):
                self._admit_waiting(draft, now)
        elif not (self._admits(draft) and self._admit_waiting(draft, now, swapped=False)):
            self._schedule_running(draft)  # no prompt admitted: the decodes run, then swap-ins
            if self._admits(draft):
                self._admit_waiting(draft, now, prompts=False)
        plan = self._freeze(draft)
        if self.num_scheduler_steps > 1 and 0 < plan.num_reqs == plan.num_decode_tokens:
            self._window, self._window_left = draft.reqs, self.num_scheduler_steps - 1
        return plan

    def update(self, plan: StepPlan, output: StepOutput, now: float) -> list[Request]:
        """Advance the scheduled requests by the step's output; returns those that finished."""
        if self.window_log is not None:  # before the window's bookkeeping below can end it
            self.window_log.append(plan.window_step if plan.window_step or self._window_left else -1)
        finished = []
        end_ids = self.end_token_ids
        sampled: Sequence[SupportsIndex] = output.token_ids  # ints of any kind, numpy's too, taken as they are
        for req, n, token in zip(self._scheduled, plan.num_new_tokens, sampled):
            req.num_computed_tokens += n
            if req.num_computed_tokens < len(req.token_ids):  # a prefill chunk short of the prompt's end: no sample
                continue
            req.append_token(token, now)
            reason = check_stop(req, end_ids)
            if reason is not None:
                req.finish(reason, now)
                finished.append(req)
        for req in finished:
            self.running.remove(req)
            if self._window_left:  # inside a multi-step window: its blocks are held to the end
                self._window_done.append(req)
            else:
                self._release(req)
        if self._window and not self._window_left:
            self._end_window()  # its last step has run
        return finished

    def _release(self, req: Request) -> None:
        self.allocator.free(req)
        self._finished_ids.append(req.request_id)

    def add_prefilled(self, req: Request, now: float) -> bool:
        """Admit a request whose prompt K/V was computed on another replica and moved here
        (disaggregated prefill): it takes blocks for its prompt, counts the prompt as computed
        and runs from its next token. False, changing nothing, if the policy admits nobody now
        (``may_admit``), or ``max_batch`` or the pool (less the admission reserve) has no room."""
        reserve = self.admission_reserve_blocks if self.running else 0
        prompt = req.num_prompt_tokens
        # the policy's admission rule, as at a step's admissions (static: only into an empty batch)
        if len(self.running) >= self.max_batch or not self._admits(PlanDraft(self.max_num_batched_tokens)):
            return False
        if self.allocator.allocate_slots(req, prompt, min_free_blocks=reserve) is None:
            return False
        req.cap_length(self.max_model_len)
        req.admit(prompt, now)
        self.running.append(req)
        self._handed_over.append(NewRequestData.from_request(req, self.allocator.block_table(req), self.plan_token_ids))
        return True

    def finish_request(self, req: Request, reason: FinishReason, now: float, error: str | None = None) -> None:
        """End a request from outside the step loop (client abort, stop string, run error)."""
        if req.is_finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.allocator.free(req)
        self._lost.pop(req, None)
        self._finished_ids.append(req.request_id)
        req.finish(reason, now, error)

    def abort_all(
        self,
        reason: FinishReason,
        now: float,
        error: str | None = None,
        submitted: Iterable[Request] = (),
        unsent: Iterable[Request] = (),
    ) -> None:
        """End every unfinished request with ``reason`` and free every block, so that the pool is
        whole: the requests the scheduler holds, any of ``submitted`` (what the caller added) that
        no list of its holds any more, and ``unsent``, which never reached it (their error says
        so). A run cut short mid-step (an interrupt, a crash) can leave a request between a list
        and the freeing of its blocks; ``Allocator.free_all`` frees what any request still holds
        and recounts what such a step may have torn."""
        self._end_window()
        for req in [*self.running, *self.waiting]:
            self.finish_request(req, reason, now, error)
        for req in unsent:
            req.finish(reason, now, f"not submitted: {error}")
        submitted = list(submitted)
        self.allocator.free_all(submitted)
        for req in submitted:
            self.finish_request(req, reason, now, error)

    # -- the machinery --------------------------------------------------------------------

    def _chunk(self, num_tokens: int, budget: int) -> int:
        """How many of ``num_tokens`` fit: all (up to the long-prefill cap), the budget's, or none."""
        cap = self.long_prefill_token_threshold
        if cap > 0 and self.chunked_prefill:  # without chunking, a prompt runs whole
            num_tokens = min(num_tokens, cap)
        if num_tokens <= budget:
            return num_tokens
        return budget if self.chunked_prefill else 0

    def _schedule_running(self, draft: PlanDraft) -> None:
        """Give every running request its next tokens (a decode, or the next chunk of its
        prompt), in place over the running list as vLLM v1's scheduler does: when a request
        cannot get its slots, victims are preempted (the list shifts under the index) until it
        fits; a request that is itself the victim ends the pass, as in vLLM (the requests after
        it wait for the next step)."""
        running, i = self.running, 0
        while i < len(running) and draft.budget > 0:
            req = running[i]
            n = self._chunk(len(req.token_ids) - req.num_computed_tokens, draft.budget)
            if n:
                new_blocks = self.allocator.allocate_slots(req, n)
                while new_blocks is None:
                    victim = self._victim_for(req)
                    if running.index(victim) <= i:
                        i -= 1  # the victim sat at or before req: the rest shifts left
                    self._preempt(victim, draft)
                    if victim is req:
                        return
                    new_blocks = self.allocator.allocate_slots(req, n)
                draft.add(req, n, new_blocks)
            i += 1

    def _admit_waiting(self, draft: PlanDraft, now: float, prompts: bool = True, swapped: bool = True) -> bool:
        """Admit waiting requests in the policy's order while ``max_batch``, the budget and the
        pool allow, stopping at one of a kind not asked for (``prompts``: to prefill, ``swapped``:
        to swap in); returns whether it admitted any."""
        allocator, waiting, admitted = self.allocator, self.waiting, False
        while waiting and len(self.running) < self.max_batch and draft.budget > 0:
            req = self._next_waiting()
            if not (swapped if req.status is RequestStatus.SWAPPED else prompts):
                break
            # an empty engine admits regardless of the reserve, or nothing could ever run
            reserve = self.admission_reserve_blocks if self.running else 0
            if req.status is RequestStatus.SWAPPED:
                n = self._chunk(len(req.token_ids) - req.num_computed_tokens, draft.budget)
                pairs = allocator.swap_in(req, n, reserve) if n else None
                if pairs is None:
                    break
                draft.swap_in += pairs
                self.swapped_blocks += len(pairs)
                computed = req.num_computed_tokens  # its K/V comes back whole
            else:
                hit = allocator.lookup_prefix(req)
                n = self._chunk(len(req.token_ids) - hit.num_tokens, draft.budget)
                if n == 0 or allocator.allocate_slots(req, n, hit, reserve) is None:
                    break
                computed = hit.num_tokens
                lost = self._lost.pop(req, None)
                if lost is not None:  # back after a recompute preemption: what the cache no longer held
                    self.recomputed_tokens += max(0, lost - hit.num_tokens)
            waiting.remove(req)
            req.admit(computed, now)
            self.running.append(req)
            draft.new_reqs.append(NewRequestData.from_request(req, allocator.block_table(req), self.plan_token_ids))
            draft.add(req, n)
            admitted = True
        return admitted

    def _window_plan(self) -> StepPlan | None:
        """The next step of a multi-step window: its batch again, a decode each, and those that
        ended in it as idle rows (vLLM 0.6 runs the whole batch to the window's last step without
        the scheduler: docs/engine.md). None ends it early: the pool has fewer free blocks than it
        has rows (vLLM reserves the window's slots at its start and preempts there instead)."""
        rows = [req for req in self._window if not req.is_finished]
        if self.allocator.num_free_blocks < len(rows):
            return None
        draft = PlanDraft(budget=self.max_num_batched_tokens)
        for req in rows:
            new_blocks = self.allocator.allocate_slots(req, 1)
            if new_blocks is None:
                raise EngineError(f"allocator {self.allocator.name!r} refused a block to request {req.request_id} "
                                  "with more blocks free than the step has rows")  # fmt: skip
            draft.add(req, 1, new_blocks)
        self._window_left -= 1
        idle = {req.request_id: req.num_computed_tokens for req in self._window_done}
        return self._freeze(draft, self.num_scheduler_steps - 1 - self._window_left, idle)

    def _end_window(self) -> None:
        """The window is over: the requests that ended inside it give their blocks back."""
        for req in self._window_done:
            self._release(req)
        self._window, self._window_left, self._window_done = [], 0, []

    def _preempt(self, victim: Request, draft: PlanDraft) -> None:
        """Take ``victim`` off the GPU and put it at the front of the waiting queue."""
        self.running.remove(victim)
        draft.unschedule(victim)
        draft.preempted.append(victim)
        self.num_preemptions += 1
        pairs = self.allocator.swap_out(victim) if self.preemption_mode == "swap" else None
        if pairs is not None:
            draft.swap_out += pairs
            self.swapped_blocks += len(pairs)
        else:  # recompute (also when swap space is full): keep the tokens, drop the K/V
            self._lost[victim] = victim.num_computed_tokens
            self.allocator.free(victim)
        victim.preempt(swapped=pairs is not None)
        self.waiting.appendleft(victim)

    def _freeze(self, draft: PlanDraft, window_step: int = 0, idle_rows: dict[ReqId, int] | None = None) -> StepPlan:
        """The plan the backend gets: the draft's rows as columns, with what changed since
        the previous plan (admissions, new blocks, swaps, preemptions, finished requests)."""
        reqs, nums = draft.reqs, draft.num_new_tokens
        self._scheduled = reqs
        self._preempted_ids += [r.request_id for r in draft.preempted]
        partial_rows, num_decodes = [], 0
        for i, (req, n) in enumerate(zip(reqs, nums)):
            if req.num_computed_tokens + n < len(req.token_ids):  # a prompt chunk short of its end
                partial_rows.append(i)
            elif n == 1 and req.num_computed_tokens >= req.num_prompt_tokens:
                num_decodes += 1
        plan = new_step_plan(
            req_ids=tuple([req.request_id for req in reqs]),
            num_computed_tokens=tuple([req.num_computed_tokens for req in reqs]),
            num_new_tokens=tuple(nums),
            new_reqs=tuple(draft.new_reqs),
            new_block_ids=draft.new_block_ids,
            partial_rows=frozenset(partial_rows),
            num_decode_tokens=num_decodes,
            swap_out=tuple(draft.swap_out),
            swap_in=tuple(draft.swap_in),
            preempted_req_ids=tuple(self._preempted_ids),
            finished_req_ids=tuple(self._finished_ids),
            window_step=window_step,
            idle_rows=idle_rows or {},
        )
        if not plan.is_empty:  # an empty plan is not executed: its news wait for the next one
            self._preempted_ids = []
            self._finished_ids = []
        return plan
