"""The scheduler and the engine loop at their edges, through their public protocol: hand-overs
(``add_prefilled``), a preempted one-token prefill row, a prompt that fills the budget exactly,
swap copies in the plan, a step whose every row was preempted, a backend's bad answers and
its clock, and an interrupt in the middle of a preemption. (Cases the mutation check,
``benchmarks/mutation_core.py``, found no test for.)"""

from __future__ import annotations

import pytest

from paged_bench.backends.base import Backend
from paged_bench.backends.sim import SimBackend
from paged_bench.core.clock import VirtualClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import StepOutput, StepPlan
from paged_bench.core.request import FinishReason, Request, RequestStatus
from paged_bench.core.scheduler.base import Scheduler
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from paged_bench.core.scheduler.preemptive import PreemptiveScheduler
from paged_bench.core.scheduler.static import StaticScheduler
from paged_bench.errors import ConfigError
from paged_bench.run.plugin_options import PreemptiveOptions
from tests.test_core_behaviours import rows, step


def prefilled(rid: str, prompt: range, max_tokens: int = 5, arrival: float = 0.0) -> Request:
    """A request whose prompt was computed on another replica, with the first token it sampled."""
    req = Request(rid, arrival, prompt, max_tokens)
    req.token_ids.append(7)
    return req


def scheduler(cls: type[Scheduler] = ContinuousScheduler, num_blocks: int = 10, budget: int = 16, max_batch: int = 2,
              **kw) -> Scheduler:  # fmt: skip
    alloc = PagedAllocator(num_blocks=num_blocks, block_size=4, prefix_caching=False)
    return cls(alloc, max_model_len=64, max_batch=max_batch, max_num_batched_tokens=budget, **kw)


def test_a_handed_over_request_runs_from_its_next_token_with_blocks_for_its_prompt():
    sched = scheduler()
    r = prefilled("r", range(10), max_tokens=100)
    assert sched.add_prefilled(r, 0.0) is True
    assert r.status is RequestStatus.RUNNING and sched.running == [r] and r.num_computed_tokens == 10
    assert r.max_num_tokens == 64  # 10 + 100, capped at max_model_len
    assert sched.allocator.num_free_blocks == 10 - 3  # 10 prompt tokens in blocks of 4
    plan = step(sched)
    assert rows(plan) == [("r", 10, 1)] and plan.num_decode_tokens == 1
    assert [(new.req_id, new.num_computed_tokens, len(new.block_ids)) for new in plan.new_reqs] == [("r", 10, 3)]
    assert step(sched).new_reqs == ()


def test_a_hand_over_is_refused_changing_nothing_where_an_admission_would_be():
    full = scheduler(max_batch=1)
    assert full.add_prefilled(prefilled("a", range(4)), 0.0)
    b = prefilled("b", range(4))
    assert full.add_prefilled(b, 0.0) is False  # max_batch
    assert b.status is RequestStatus.WAITING and full.running[0].request_id == "a"
    assert full.allocator.num_free_blocks == 9
    static = scheduler(StaticScheduler)
    assert static.add_prefilled(prefilled("a", range(4)), 0.0)
    assert not static.add_prefilled(prefilled("b", range(4)), 0.0)  # static batching: only into an empty batch
    short = scheduler(num_blocks=4)
    assert not short.add_prefilled(prefilled("a", range(20)), 0.0) and short.allocator.num_free_blocks == 4
    # a watermark of half the pool (5 blocks): an empty engine takes 6 blocks regardless, then
    # a one-block hand-over would leave 3 free
    marked = scheduler(PreemptiveScheduler, watermark=0.5)
    assert marked.add_prefilled(prefilled("a", range(24)), 0.0)
    assert not marked.add_prefilled(prefilled("b", range(4)), 0.0) and marked.allocator.num_free_blocks == 4


def test_a_preempted_one_token_prefill_row_is_no_decode():
    """V (5 s) computes 9 of its 10 prompt tokens in step 1 (budget 9, 3 blocks); F (0 s) is
    handed over with 4 prompt tokens computed (the 4th and last block). Step 2: V's last
    prompt token is a one-token row that is no decode; F's decode (position 4) needs a block:
    V, the latest arrival, is preempted and taken out of the step. What is left is F's decode,
    counted as one."""
    sched = scheduler(PreemptiveScheduler, num_blocks=4, budget=9, victim="latest_arrival")
    v = Request("V", 5.0, range(100, 110), 10)
    sched.add_request(v, 0.0)
    assert rows(step(sched)) == [("V", 0, 9)]
    assert sched.add_prefilled(prefilled("F", range(200, 204)), 0.0)
    plan = step(sched)
    assert plan.preempted_req_ids == ("V",) and rows(plan) == [("F", 4, 1)]
    assert plan.num_decode_tokens == 1 and plan.num_prefill_tokens == 0


def test_the_last_token_of_the_budget_goes_to_the_last_row():
    """A's 5-token prompt is chunked to the 4-token budget; B, C and D are handed over. In
    step 2, A's last prompt token, then the three decodes, take the budget to its last token."""
    sched = scheduler(budget=4, max_batch=4)
    sched.add_request(Request("A", 0.0, range(100, 105), 5), 0.0)
    assert rows(step(sched)) == [("A", 0, 4)]
    for rid in "BCD":
        assert sched.add_prefilled(prefilled(rid, range(3)), 0.0)
    assert rows(step(sched)) == [("A", 4, 1), ("B", 3, 1), ("C", 3, 1), ("D", 3, 1)]


@pytest.mark.parametrize("watermark", ["abc", -0.5, 1.0])
def test_a_watermark_that_is_no_fraction_of_the_pool_is_refused_naming_it(watermark):
    with pytest.raises(ConfigError, match="scheduler.watermark"):
        PreemptiveOptions(max_batch=2, max_num_batched_tokens=16, watermark=watermark)


def test_without_chunking_a_prompt_that_fills_the_budget_exactly_is_admitted():
    alloc = PagedAllocator(num_blocks=16, block_size=4)
    sched = ContinuousScheduler(alloc, max_model_len=16, max_batch=2, max_num_batched_tokens=16, chunked_prefill=False)
    sched.add_request(Request("a", 0.0, range(10), 2), 0.0)
    sched.add_request(Request("b", 0.0, range(100, 106), 2), 0.0)  # the 6 tokens of budget left
    assert rows(step(sched)) == [("a", 0, 10), ("b", 0, 6)]


def test_the_plan_carries_the_swap_copies_out_and_back_in():
    """X (4-token prompt) and Y, Z, W (3 tokens each) fill 4 blocks; each samples a token. In
    step 2 X's decode needs a 5th block: W, the last admitted, is swapped out, its one block of
    computed K/V copied to CPU block 0. X, Y and Z finish in step 2; in step 3 W's block comes
    back and W decodes from position 3."""
    alloc = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=False)
    sched = PreemptiveScheduler(alloc, max_model_len=64, max_batch=4, max_num_batched_tokens=64, mode="swap")
    reqs = [Request("X", 0.0, [1, 2, 3, 4], 2)] + [Request(r, 0.0, [5, 6, 7], 2) for r in "YZW"]
    for r in reqs:
        sched.add_request(r, 0.0)
    step(sched)
    plan = step(sched)
    w_block = plan.swap_out[0][0] if plan.swap_out else None
    assert plan.preempted_req_ids == ("W",) and plan.swap_out == ((w_block, 0),) and plan.swap_in == ()
    assert reqs[3].status is RequestStatus.SWAPPED and all(r.is_finished for r in reqs[:3])
    plan = step(sched)
    assert len(plan.swap_in) == 1 and plan.swap_in[0][0] == 0 and plan.swap_out == ()
    assert rows(plan) == [("W", 3, 1)] and sched.swapped_blocks == 2


def sim_engine(sched: Scheduler) -> Engine:
    backend = SimBackend()
    backend.bind(sched.allocator)
    return Engine(sched, backend, VirtualClock())


def test_step_records_number_the_steps_and_count_every_swapped_block():
    sched = scheduler(PreemptiveScheduler, num_blocks=40, budget=1024, max_batch=8, mode="swap")
    rs = [Request(i, 0.001 * i, range(1000 * i, 1000 * i + 10), 60) for i in range(4)]
    result = sim_engine(sched).run(rs)
    assert result.swapped_blocks > 0 and result.leaks == []
    assert [s.step for s in result.steps] == list(range(len(result.steps)))
    assert sum(s.swapped_blocks for s in result.steps) == result.swapped_blocks


class SelfVictim(PreemptiveScheduler):
    def choose_victim(self, req):
        return req


def test_a_step_that_only_swaps_out_is_a_step():
    """Its only row preempted by swap: no token is computed, but the backend must copy the
    victim's blocks out, so the plan is executed and recorded."""
    sched = scheduler(SelfVictim, num_blocks=2, mode="swap")
    engine = sim_engine(sched)
    r = Request("r", 0.0, range(8), 5)
    engine.add_request(r)
    engine.step()
    assert engine.step() == [] and r.status is RequestStatus.SWAPPED
    assert len(engine.steps) == 2 and engine.steps.last().swapped_blocks == 2 and engine.steps.last().batch_size == 0


def test_a_step_whose_every_row_was_preempted_is_no_step():
    sched = scheduler(SelfVictim, num_blocks=2)
    engine = sim_engine(sched)
    r = Request("r", 0.0, range(8), 5)
    engine.add_request(r)
    engine.step()
    assert engine.step() == [] and r.status is RequestStatus.PREEMPTED
    assert len(engine.steps) == 1  # the prefill's; the step that only preempted ran nothing


class Answering(Backend):
    """Answers every plan with ``answer(plan)``."""

    name = "answering"
    clock = "virtual"

    def __init__(self, answer, clock: str = "virtual") -> None:
        super().__init__()
        self.answer, self.clock = answer, clock  # type: ignore[misc]

    def execute(self, plan: StepPlan) -> StepOutput:
        return self.answer(plan)


def run_with(backend: Backend, n: int = 2):
    sched = scheduler(budget=64)
    rs = [Request(i, 0.0, range(4), 3) for i in range(n)]
    return Engine(sched, backend, VirtualClock()).run(rs), rs


def test_a_backends_malformed_answer_stops_the_run_naming_it():
    result, rs = run_with(Answering(lambda plan: None))
    assert "backend 'answering' returned NoneType" in result.error
    for token in (-1, "x"):
        result, rs = run_with(Answering(lambda plan, t=token: StepOutput([t] * plan.num_reqs, 0.01)))
        assert "backend 'answering' returned 2 tokens" in result.error, result.error
        assert "and a duration of 0.01 s" in result.error
        assert result.leaks == [] and all(r.finish_reason is FinishReason.ERROR for r in rs)


def test_a_backends_answer_of_the_wrong_length_or_a_negative_duration_is_refused():
    result, _ = run_with(Answering(lambda plan: StepOutput([1], 0.01)))
    assert "backend 'answering' returned 1 token (int) and a duration of 0.01 s for a step of 2 rows" in result.error
    result, _ = run_with(Answering(lambda plan: StepOutput([1] * plan.num_reqs, -0.01)))
    assert "returned 2 tokens (int) and a duration of -0.01 s" in result.error


def test_a_step_lasts_what_the_backend_says_or_on_a_wall_backend_what_it_took():
    result, _ = run_with(Answering(lambda plan: StepOutput([1] * plan.num_reqs, 0.0)))
    assert {s.duration for s in result.steps} == {0.0}  # a cost model may price a step at nothing
    result, _ = run_with(Answering(lambda plan: StepOutput([1] * plan.num_reqs, 0.0), clock="wall"))
    assert result.error is None and len(result.steps) == 3
    assert all(0 < s.duration < 1 for s in result.steps)  # a real model on virtual time: timed
    result, _ = run_with(Answering(lambda plan: StepOutput([1] * plan.num_reqs, 0.5), clock="wall"))
    assert {s.duration for s in result.steps} == {0.5}


def test_each_run_starts_the_clock_again_and_an_interrupt_ends_requests_when_it_lands():
    engine = Engine(scheduler(budget=64), Answering(lambda plan: StepOutput([1] * plan.num_reqs, 0.25)), VirtualClock())
    engine.clock.wait_until(5.0)  # a clock left running: the run starts it again

    def interrupt(now, finished):
        raise KeyboardInterrupt

    rs = [Request(i, 0.0, range(4), 3) for i in range(2)]
    result = engine.run(rs, on_step=interrupt)
    assert result.interrupted and len(result.steps) == 1 and result.steps.last().time == 0.25
    assert [r.finish_time for r in rs] == [0.25, 0.25]  # when the step it landed after ended


def test_an_engines_leaks_are_its_allocators_else_what_the_pool_shows():
    """``Engine.result`` reports what the allocator says it holds; an allocator that says
    nothing while blocks are held (a plugin's) is caught by the pool's own count."""

    class Forgetful(PagedAllocator):
        def leaks(self):
            return []

    for alloc in (PagedAllocator(num_blocks=8, block_size=4), Forgetful(num_blocks=8, block_size=4)):
        sched = ContinuousScheduler(alloc, max_model_len=64, max_batch=2, max_num_batched_tokens=64)
        engine = sim_engine(sched)
        r = Request("r", 0.0, range(6), 5)
        engine.add_request(r)
        engine.step()  # r holds 2 blocks, and runs on
        leaks = engine.result([r], None, False).leaks
        if isinstance(alloc, Forgetful):
            assert leaks == ["allocator 'paged' has 6 of 8 blocks free", "allocator 'paged' counts 6 live slots"]
        else:
            assert leaks and all(m.startswith("allocator 'paged': ") for m in leaks)


def test_a_request_refused_at_the_door_frees_its_place_in_a_closed_loop():
    engine = Engine(scheduler(budget=64), Answering(lambda plan: StepOutput([1] * plan.num_reqs, 0.01)), VirtualClock())
    rs = [Request(0, 0.0, range(100), 3), Request(1, 0.0, range(4), 3)]  # the first longer than max_model_len
    result = engine.run(rs, max_concurrency=1)
    assert rs[0].finish_reason is FinishReason.REJECTED and rs[1].finish_reason is FinishReason.LENGTH
    assert result.error is None


class Crashing(ContinuousScheduler):
    def may_admit(self, plan):
        if self.running:
            raise RuntimeError("a policy's bug")
        return True


def test_a_policys_crash_stops_the_run_naming_it_and_ends_every_request():
    engine = Engine(scheduler(Crashing, budget=64), Answering(lambda plan: StepOutput([1] * plan.num_reqs, 0.01)),
                    VirtualClock())  # fmt: skip
    rs = [Request(i, 0.0, range(4), 3) for i in range(2)]
    result = engine.run(rs)
    assert result.error.startswith("RuntimeError: a policy's bug (raised at ")
    assert all(r.finish_reason is FinishReason.ERROR for r in rs) and result.leaks == []
    assert not engine.scheduler.has_unfinished()  # its lists are empty: an engine can be used again


def test_a_request_caught_mid_preemption_by_an_interrupt_is_ended_too():
    """Preempting takes the victim off the running list before it joins the waiting queue: an
    interrupt in between (here in the allocator's ``free``) leaves it on neither list."""

    class InterruptedFree(PagedAllocator):  # an override: the compiled core calls its own methods
        fired = False

        def free(self, req):
            if not self.fired and req.status is RequestStatus.RUNNING and req not in sched.running:
                self.fired = True  # the signal lands once
                raise KeyboardInterrupt
            super().free(req)

    alloc = InterruptedFree(num_blocks=40, block_size=4)
    sched = PreemptiveScheduler(alloc, max_model_len=256, max_batch=8, max_num_batched_tokens=1024)
    rs = [Request(i, 0.001 * i, range(1000 * i, 1000 * i + 10), 60) for i in range(4)]
    result = sim_engine(sched).run(rs)
    assert result.interrupted and result.num_preemptions == 1
    assert all(r.finish_reason is FinishReason.ABORT for r in rs)
    assert result.leaks == [] and alloc.num_free_blocks == 40


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_preemption_reaches_the_backend_in_the_first_plan_it_runs(mode):
    """Swapped out, the victim's copies make the plan a step: it is announced there, once.
    Recomputed, the plan runs nothing and is not executed: the next plan announces it again."""
    sched = scheduler(SelfVictim, num_blocks=2, mode=mode)
    sched.add_request(Request("r", 0.0, range(8), 5), 0.0)
    step(sched)  # the prefill fills both blocks; the next token needs a third
    plan = step(sched)
    assert plan.preempted_req_ids == ("r",) and plan.req_ids == ()
    assert bool(plan.swap_out) is (mode == "swap")
    after = sched.schedule(0.0)  # nothing fits yet either way
    assert after.preempted_req_ids == (() if mode == "swap" else ("r",))


def test_long_prefill_token_threshold_caps_each_prompts_chunk_and_leaves_the_budget_to_others():
    """vLLM's long_prefill_token_threshold (scheduler.long_prefill_token_threshold): a long prompt gets at most that
    many tokens a step, running or admitted, so a prompt behind it is admitted in the same step;
    without chunking, or at 0, a prompt runs whole as before."""
    sched = scheduler(num_blocks=16, budget=16)
    sched.long_prefill_token_threshold = 6
    sched.add_request(Request("long", 0.0, range(20), 2), 0.0)
    sched.add_request(Request("short", 0.0, range(100, 104), 2), 0.0)
    assert rows(step(sched)) == [("long", 0, 6), ("short", 0, 4)]
    assert rows(step(sched)) == [("long", 6, 6), ("short", 4, 1)]
    assert rows(step(sched)) == [("long", 12, 6)]  # short's two tokens are out
    assert rows(step(sched)) == [("long", 18, 2)]
    one = scheduler(num_blocks=16, budget=16)
    one.long_prefill_token_threshold = 1
    one.add_request(Request("long", 0.0, range(20), 2), 0.0)
    assert rows(step(one)) == [("long", 0, 1)]
    whole = scheduler(num_blocks=16, budget=32, chunked_prefill=False)
    whole.long_prefill_token_threshold = 6
    whole.add_request(Request("long", 0.0, range(20), 2), 0.0)
    assert rows(step(whole)) == [("long", 0, 20)]
