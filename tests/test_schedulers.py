"""Scheduling policies through the real engine loop on virtual time."""

from __future__ import annotations

import pytest

from paged_bench.backends.sim import SimBackend
from paged_bench.core.clock import VirtualClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.contiguous import ContiguousAllocator
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import StepOutput
from paged_bench.core.request import FinishReason, Request, RequestStatus
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from paged_bench.core.scheduler.preemptive import PreemptiveScheduler
from paged_bench.core.scheduler.static import StaticScheduler
from paged_bench.errors import ConfigError
from paged_bench.run import registry
from paged_bench.run.bench import build
from paged_bench.run.compose import compose_config


def make_engine(scheduler_cls=ContinuousScheduler, *, num_blocks=64, block_size=4, max_batch=8,
                budget=1024, max_model_len=256, chunked=True, allocator=None, **kw) -> Engine:
    alloc = allocator or PagedAllocator(num_blocks=num_blocks, block_size=block_size)
    sched = scheduler_cls(alloc, max_model_len=max_model_len, max_batch=max_batch,
                          max_num_batched_tokens=budget, chunked_prefill=chunked, **kw)
    backend = SimBackend()
    backend.bind(alloc)
    return Engine(sched, backend, VirtualClock())


def reqs(specs) -> list[Request]:
    """specs: (arrival, prompt_len, output_len) triples; distinct prompts per request."""
    return [Request(i, t, [1000 * (i + 1) + j for j in range(p)], o) for i, (t, p, o) in enumerate(specs)]


def assert_clean(result, requests):
    assert result.leaks == []
    for r in requests:
        assert r.is_finished


def test_static_admits_nobody_until_the_whole_batch_finishes():
    rs = reqs([(0.0, 8, 40), (0.0, 8, 2), (0.0, 8, 2), (0.001, 8, 2)])
    result = make_engine(StaticScheduler, max_batch=2).run(rs)
    assert_clean(result, rs)
    first_batch_end = max(rs[0].finish_time, rs[1].finish_time)
    assert rs[2].first_scheduled_time >= first_batch_end  # waited for the 40-token straggler
    assert rs[3].first_scheduled_time >= first_batch_end


def test_continuous_takes_a_freed_seat_at_the_next_step():
    rs = reqs([(0.0, 8, 40), (0.0, 8, 2), (0.0, 8, 2)])
    result = make_engine(max_batch=2).run(rs)
    assert_clean(result, rs)
    assert rs[2].first_scheduled_time == rs[1].finish_time  # the step right after
    assert rs[2].finish_time < rs[0].finish_time
    assert max(s.running for s in result.steps) == 2


def test_every_step_respects_max_batch_and_the_token_budget():
    rs = reqs([(0.0, 30, 5)] * 10)
    result = make_engine(max_batch=3, budget=40).run(rs)
    assert_clean(result, rs)
    for s in result.steps:
        assert s.batch_size <= 3
        assert s.prefill_tokens + s.decode_tokens <= 40


def test_chunked_prefill_spreads_a_long_prompt_over_steps():
    (r,) = rs = reqs([(0.0, 100, 3)])
    result = make_engine(budget=16).run(rs)
    assert_clean(result, rs)
    assert r.num_output_tokens == 3
    prefill_steps = [s for s in result.steps if s.prefill_tokens > 0]
    assert len(prefill_steps) == 7  # ceil(100 / 16)
    assert r.first_token_time == prefill_steps[-1].time


def test_without_chunking_the_budget_must_hold_a_whole_prompt():
    with pytest.raises(ConfigError, match="max_num_batched_tokens=64 .*chunked_prefill is off"):
        build(compose_config("max_num_batched_tokens=64", "max_model_len=256", "scheduler.chunked_prefill=false"))


def test_without_chunking_a_prompt_waits_for_a_step_with_room():
    rs = reqs([(0.0, 200, 2), (0.0, 200, 2)])
    result = make_engine(budget=256, chunked=False).run(rs)
    assert_clean(result, rs)
    assert rs[1].first_scheduled_time > rs[0].first_scheduled_time


def test_continuous_stops_cleanly_when_the_pool_runs_dry():
    rs = reqs([(0.0, 10, 60)] * 4)
    engine = make_engine(num_blocks=40, block_size=4)  # 160 slots for 4 x 70 tokens
    result = engine.run(rs)
    assert result.error and "KV pool exhausted" in result.error and "scheduler=preemptive" in result.error
    assert result.leaks == [] and engine.allocator.num_free_blocks == 40
    assert all(r.finish_reason is FinishReason.ERROR for r in rs)
    assert result.steps  # what ran is kept


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemptive_finishes_everything_by_preempting_the_latest_arrival(mode):
    rs = reqs([(0.0, 10, 60), (0.001, 10, 60), (0.002, 10, 60), (0.003, 10, 60)])
    engine = make_engine(PreemptiveScheduler, num_blocks=40, block_size=4, mode=mode)
    result = engine.run(rs)
    assert_clean(result, rs)
    assert all(r.finish_reason is FinishReason.LENGTH and r.num_output_tokens == 60 for r in rs)
    assert result.num_preemptions > 0
    assert rs[0].num_preemptions == 0  # the earliest arrival is never the victim
    assert rs[-1].num_preemptions > 0
    if mode == "swap":
        assert result.swapped_blocks > 0 and result.recomputed_tokens == 0
    else:
        assert result.recomputed_tokens > 0 and result.swapped_blocks == 0


def test_swap_falls_back_to_recompute_when_swap_space_is_full():
    rs = reqs([(0.0, 10, 60), (0.001, 10, 60), (0.002, 10, 60)])
    alloc = PagedAllocator(num_blocks=30, block_size=4, swap_blocks=0)
    result = make_engine(PreemptiveScheduler, allocator=alloc, mode="swap").run(rs)
    assert_clean(result, rs)
    assert result.num_preemptions > 0 and result.swapped_blocks == 0 and result.recomputed_tokens > 0


def test_recompute_preemption_revives_its_own_cached_blocks():
    rs = reqs([(0.0, 40, 50), (0.001, 40, 50)])
    engine = make_engine(PreemptiveScheduler, num_blocks=28, block_size=4)
    result = engine.run(rs)
    assert_clean(result, rs)
    assert result.num_preemptions > 0
    # the victim found its own blocks still cached: counted apart, as vLLM v1 does, so the
    # hit rate of first admissions stays honest
    assert result.preempted_prefix_hit_tokens > 0 and result.prefix_hit_tokens == 0


def test_no_admissions_in_a_step_that_preempted():
    alloc = PagedAllocator(num_blocks=6, block_size=4, prefix_caching=False)
    sched = PreemptiveScheduler(alloc, max_model_len=64, max_batch=8, max_num_batched_tokens=64)
    a, b, c = reqs([(0.0, 12, 20), (0.0, 12, 20), (0.0, 3, 5)])
    sched.add_request(a, 0.0)
    sched.add_request(b, 0.0)
    plan = sched.schedule(0.0)  # both prefill: 6 blocks
    sched.update(plan, StepOutput([0] * plan.num_reqs), 0.0)
    sched.add_request(c, 0.0)
    plan = sched.schedule(0.0)  # a needs a 4th block: b is preempted
    assert plan.preempted_req_ids == (b.request_id,) and b.status is RequestStatus.PREEMPTED
    assert c.request_id not in plan.req_ids and list(sched.waiting) == [b, c]


def test_watermark_keeps_blocks_free_at_admission():
    alloc = PagedAllocator(num_blocks=20, block_size=4, prefix_caching=False)
    sched = PreemptiveScheduler(alloc, max_model_len=64, max_batch=8, max_num_batched_tokens=256, watermark=0.5)
    for r in reqs([(0.0, 16, 4)] * 4):
        sched.add_request(r, 0.0)
    sched.schedule(0.0)
    # an empty engine admits the first regardless; after that 10 of 20 blocks stay free
    assert len(sched.running) == 2 and alloc.num_free_blocks == 12


def test_watermark_rounds_down_as_vllm():
    alloc = PagedAllocator(num_blocks=20, block_size=4)
    sched = PreemptiveScheduler(alloc, max_model_len=64, max_batch=8, max_num_batched_tokens=256, watermark=0.33)
    assert sched.admission_reserve_blocks == 6  # int(0.33 * 20), vLLM v1's int(watermark * num_blocks)


class SelfVictim(PreemptiveScheduler):
    def choose_victim(self, req):
        return req


def test_a_request_that_preempts_itself_ends_the_running_pass_as_vllm():
    """vLLM v1: ``if preempted_req == request: break``; the running requests after it wait."""
    alloc = PagedAllocator(num_blocks=3, block_size=4, prefix_caching=False)
    sched = SelfVictim(alloc, max_model_len=64, max_batch=4, max_num_batched_tokens=256)
    a, b = reqs([(0.0, 8, 10), (0.0, 2, 10)])
    for r in (a, b):
        sched.add_request(r, 0.0)
    plan = sched.schedule(0.0)  # a: 2 blocks, b: 1 block, the pool full
    sched.update(plan, StepOutput([0] * plan.num_reqs), 0.0)
    plan = sched.schedule(0.0)  # a needs a 3rd block and gives itself up
    assert plan.preempted_req_ids == (a.request_id,)
    assert plan.req_ids == ()  # b, after a, would fit in its block but is not scheduled this step
    assert b.status is RequestStatus.RUNNING
    plan = sched.schedule(0.0)
    assert plan.req_ids == (b.request_id,)


def test_contiguous_caps_concurrency_at_the_number_of_slabs():
    alloc = ContiguousAllocator(num_blocks=64, block_size=4, max_model_len=64)  # 4 slabs
    rs = reqs([(0.0, 8, 20)] * 8)
    result = make_engine(allocator=alloc, max_model_len=64).run(rs)
    assert_clean(result, rs)
    assert max(s.running for s in result.steps) == 4
    assert max(s.kv_reserved_slots for s in result.steps) == 4 * 64


def test_bad_scheduler_options_name_the_key():
    alloc = PagedAllocator(num_blocks=8, block_size=4)
    limits = {"max_model_len": 32, "max_batch": 2, "max_num_batched_tokens": 64}
    with pytest.raises(ConfigError, match="scheduler.mode"):
        registry.create("scheduler", "preemptive", alloc, **limits, mode="evict")
    with pytest.raises(ConfigError, match="scheduler.watermark"):
        registry.create("scheduler", "preemptive", alloc, **limits, watermark=1.0)
    with pytest.raises(ConfigError, match="max_batch"):
        registry.create("scheduler", "continuous", alloc, **{**limits, "max_batch": 0})
