"""The engine's reading of a backend's answer: cases the mutation check
(``benchmarks/mutation_core.py``) found no test for."""

from __future__ import annotations

from types import SimpleNamespace

from paged_bench.core.clock import VirtualClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import StepOutput
from paged_bench.core.request import FinishReason, Request
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from tests.test_core_behaviours import preemptive, step
from tests.test_core_scheduling import Answering, run_with


class FreeOnceBroken(PagedAllocator):
    """Its first ``free`` raises a TypeError of its own (a bug), then frees as the paged one."""

    broken = True

    def free(self, req):
        if self.broken:
            self.broken = False
            raise TypeError("a bug in free")
        super().free(req)


def test_a_type_error_of_the_engines_own_is_not_blamed_on_a_backend_that_answered_well():
    # token 0 is a token: the backend answered well, the TypeError is the allocator's
    alloc = FreeOnceBroken(num_blocks=10, block_size=4, prefix_caching=False)
    sched = ContinuousScheduler(alloc, max_model_len=64, max_batch=2, max_num_batched_tokens=64)
    engine = Engine(sched, Answering(lambda plan: StepOutput([0] * plan.num_reqs, 0.01)), VirtualClock())
    result = engine.run([Request(0, 0.0, range(4), 1)])
    assert result.error.startswith("TypeError: a bug in free"), result.error
    assert "backend" not in result.error and result.leaks == []


def test_an_answer_that_only_looks_like_a_step_output_is_named_by_its_type():
    result, _ = run_with(Answering(lambda plan: SimpleNamespace(token_ids=[1] * plan.num_reqs, duration=0.01)))
    assert "backend 'answering' returned SimpleNamespace for a step of 2 rows" in result.error, result.error


def test_a_victim_scheduled_earlier_in_the_step_takes_its_new_block_back_out_of_the_plan():
    """``victim=latest_arrival``: "late" (admitted first, arrived last) and "early" both cross
    into a second block in the same step, a pool of 3 blocks has room for one: late takes it,
    then early needs one and preempts late, already scheduled: the plan announces early's new
    block only, and late as preempted."""
    sched = preemptive(num_blocks=3, budget=64, max_batch=4, prefix_caching=False, victim="latest_arrival")
    late, early = Request("late", 1.0, range(3), 8), Request("early", 0.0, range(100, 104), 8)
    sched.add_request(late, 1.0)
    step(sched)  # late's prompt: 3 tokens in its first block
    sched.add_request(early, 0.0)
    step(sched)  # late's 4th token, early's prompt: both first blocks full
    plan = step(sched)
    assert plan.preempted_req_ids == ("late",) and plan.req_ids == ("early",)
    assert list(plan.new_block_ids) == ["early"] and sched.allocator.num_free_blocks == 1


def test_each_finished_request_is_announced_to_the_backend_once():
    sched = preemptive(num_blocks=16, budget=64, max_batch=4)
    for i, n in enumerate((1, 2, 3)):
        sched.add_request(Request(i, 0.0, range(10 * i, 10 * i + 4), n), 0.0)
    announced = []
    while sched.has_unfinished():
        announced += step(sched).finished_req_ids
    assert sorted(announced) == [0, 1]  # the last finished waits for a plan that is never made


class NeverAdmits(ContinuousScheduler):
    name = "never_admits"

    def may_admit(self, plan):
        return False


def test_a_policy_that_plans_an_empty_step_while_requests_wait_stops_the_run_naming_it():
    alloc = PagedAllocator(num_blocks=10, block_size=4, prefix_caching=False)
    sched = NeverAdmits(alloc, max_model_len=64, max_batch=2, max_num_batched_tokens=64)
    engine = Engine(sched, Answering(lambda plan: StepOutput([0] * plan.num_reqs, 0.01)), VirtualClock())
    req = Request(0, 0.0, range(4), 1)
    result = engine.run([req])
    assert result.error == "scheduler 'never_admits' planned an empty step with 0 running and 1 waiting requests"
    assert req.finish_reason is FinishReason.ERROR and result.leaks == []
