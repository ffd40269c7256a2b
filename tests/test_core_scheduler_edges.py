"""The scheduler where only an edge shows its rules: an empty prompt, EOS, a pool one block
short of a prompt (refused, changing nothing), aborts of waiting, torn and never-listed
requests, a plugin's own preemption policy. (Cases the mutation check,
``benchmarks/mutation_core.py``, found no test for.)"""

from __future__ import annotations

from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.request import FinishReason, Request, RequestStatus
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from tests.test_core_behaviours import step
from tests.test_core_kv import pressed, run


def continuous(num_blocks: int = 8, **kw) -> ContinuousScheduler:
    alloc = PagedAllocator(num_blocks=num_blocks, block_size=4, prefix_caching=False)
    return ContinuousScheduler(alloc, max_model_len=64, max_batch=4, max_num_batched_tokens=64, **kw)


def test_an_empty_prompt_is_refused_at_the_door():
    sched = continuous()
    req = Request(0, 0.0, [], 4)
    sched.add_request(req, 0.0)
    assert req.finish_reason is FinishReason.REJECTED and not sched.has_unfinished()


def test_the_schedulers_eos_stops_a_request_that_asks_to_stop_there():
    sched = continuous(eos_token_id=9)
    stops, runs_on = Request("stops", 0.0, [1, 2], 4, ignore_eos=False), Request("runs", 0.0, [3, 4], 4)
    for req in (stops, runs_on):
        sched.add_request(req, 0.0)
    step(sched, {"stops": 9, "runs": 9})
    assert stops.finish_reason is FinishReason.STOP and not runs_on.is_finished


def test_a_prompt_one_block_past_the_free_pool_is_refused_changing_nothing():
    """An idle engine admits without a reserve, but never past the pool: the waiting prompt
    (3 blocks) meets 2 free, no table is left behind, the request still waits."""
    sched = continuous(num_blocks=2)
    req = Request(0, 0.0, range(12), 4)
    sched.add_request(req, 0.0)
    assert sched.schedule(0.0).is_empty
    assert sched.allocator.leaks() == [] and sched.allocator.num_free_blocks == 2 and list(sched.waiting) == [req]


def test_a_hand_over_into_an_idle_engine_takes_the_whole_pool_and_no_more():
    sched = continuous(num_blocks=2)
    fits, too_long = Request("fits", 0.0, range(8), 4), Request("long", 0.0, range(9), 4)
    for req in (fits, too_long):
        req.token_ids.append(0)  # the token its prefill sampled, elsewhere
    assert not sched.add_prefilled(too_long, 0.0)  # its 9-token prompt needs a third block
    assert sched.allocator.leaks() == [] and sched.allocator.num_free_blocks == 2
    assert sched.add_prefilled(fits, 0.0) and sched.allocator.num_free_blocks == 0


def test_abort_all_ends_the_waiting_running_torn_and_unsent_requests_and_frees_every_block():
    sched = continuous(num_blocks=8)
    running, waiting = Request("running", 0.0, range(4), 8), Request("waiting", 0.0, range(4), 8)
    sched.add_request(running, 0.0)
    step(sched)
    sched.add_request(waiting, 0.0)
    torn = Request("torn", 0.0, range(4), 8)  # holds blocks, on no list: as a step cut short leaves it
    assert sched.allocator.allocate_slots(torn, 4) is not None
    unsent = Request("unsent", 0.0, range(4), 8)
    sched.abort_all(FinishReason.ABORT, 1.0, "stopped", submitted=(r for r in [running, waiting, torn]),
                    unsent=[unsent])  # fmt: skip
    assert [r.finish_reason for r in (running, waiting, torn, unsent)] == [FinishReason.ABORT] * 4
    assert unsent.error == "not submitted: stopped" and not sched.has_unfinished()
    assert sched.allocator.leaks() == [] and sched.allocator.num_free_blocks == 8


def test_abort_all_ends_the_schedulers_own_requests_without_being_told_of_them():
    sched = continuous()
    reqs = [Request(i, 0.0, range(4), 8) for i in range(2)]
    sched.add_request(reqs[0], 0.0)
    step(sched)
    sched.add_request(reqs[1], 0.0)
    sched.abort_all(FinishReason.ERROR, 1.0, "boom")
    assert all(r.finish_reason is FinishReason.ERROR for r in reqs) and sched.allocator.leaks() == []


def test_a_waiting_request_finished_from_outside_leaves_the_queue():
    sched = continuous()
    req = Request(0, 0.0, range(4), 8)
    sched.add_request(req, 0.0)
    sched.finish_request(req, FinishReason.ABORT, 0.5)
    assert not sched.waiting and not sched.has_unfinished() and sched.schedule(1.0).is_empty


class TailVictim(ContinuousScheduler):
    """A plugin's own policy: it preempts the last admitted, and says nothing of how."""

    name = "tail_victim"

    def choose_victim(self, req):
        return self.running[-1]


def test_a_plugin_that_preempts_without_saying_how_recomputes():
    alloc = PagedAllocator(num_blocks=40, block_size=4, swap_blocks=40)
    sched = TailVictim(alloc, max_model_len=256, max_batch=8, max_num_batched_tokens=1024)
    rs = pressed()
    result = run(sched, rs)
    assert result.num_preemptions > 0 and result.recomputed_tokens > 0 and result.swapped_blocks == 0
    assert all(r.finish_reason is FinishReason.LENGTH for r in rs) and result.leaks == []
    assert all(r.status is RequestStatus.FINISHED for r in rs)
