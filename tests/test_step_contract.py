"""The step contract: a frozen, self-contained plan that backends read without live requests."""

from __future__ import annotations

import pickle

import pytest

from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import StepOutput, StepPlan
from paged_bench.core.request import FinishReason, Request
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from paged_bench.core.scheduler.preemptive import PreemptiveScheduler
from tests.test_schedulers import make_engine, reqs


def _objects(value):
    """Every object reachable through tuples, lists, dicts and dataclass slots."""
    yield value
    if isinstance(value, (tuple, list, frozenset, set)):
        for v in value:
            yield from _objects(v)
    elif isinstance(value, dict) or hasattr(value, "items"):
        for k, v in value.items():
            yield from _objects(k)
            yield from _objects(v)
    elif hasattr(value, "__slots__"):
        for name in value.__slots__:
            yield from _objects(getattr(value, name))


def test_the_plan_is_immutable_self_contained_and_picklable():
    alloc = PagedAllocator(num_blocks=32, block_size=4)
    sched = ContinuousScheduler(alloc, max_model_len=64, max_batch=4, max_num_batched_tokens=64)
    a, b = reqs([(0.0, 8, 3), (0.0, 6, 3)])
    for r in (a, b):
        sched.add_request(r, 0.0)
    plan = sched.schedule(0.0)
    assert not any(isinstance(o, Request) for o in _objects(plan))
    assert pickle.loads(pickle.dumps(plan)) == plan
    with pytest.raises(AttributeError):
        plan.req_ids = ()  # type: ignore[misc]
    # new requests carry their tokens, table and sampling once
    assert plan.req_ids == (0, 1) and plan.num_computed_tokens == (0, 0) and plan.num_new_tokens == (8, 6)
    assert [n.token_ids for n in plan.new_reqs] == [tuple(a.token_ids), tuple(b.token_ids)]
    assert [list(n.block_ids) for n in plan.new_reqs] == [alloc.block_table(a), alloc.block_table(b)]
    assert plan.new_reqs[0].sampling.max_tokens == 3
    sched.update(plan, StepOutput([5, 5]), 0.1)
    # scheduled again: columns only; a table that grows says so in new_block_ids
    plan = sched.schedule(0.1)
    assert plan.new_reqs == () and plan.num_computed_tokens == (8, 6) and plan.num_new_tokens == (1, 1)
    assert plan.new_block_ids == {0: (alloc.block_table(a)[-1],)}  # a's 9th token opens its 3rd block
    assert plan.num_decode_tokens == 2 and plan.num_prefill_tokens == 0


def test_finished_and_preempted_requests_are_announced_to_the_backend():
    alloc = PagedAllocator(num_blocks=6, block_size=4, prefix_caching=False)
    sched = PreemptiveScheduler(alloc, max_model_len=64, max_batch=8, max_num_batched_tokens=64)
    a, b = reqs([(0.0, 12, 20), (0.0, 12, 20)])
    sched.add_request(a, 0.0)
    sched.add_request(b, 0.0)
    sched.update(plan := sched.schedule(0.0), StepOutput([0] * plan.num_reqs), 0.0)
    plan = sched.schedule(0.0)  # a needs a 4th block: b (the last admitted) is preempted
    assert plan.preempted_req_ids == (b.request_id,) and plan.req_ids == (a.request_id,)
    sched.finish_request(a, FinishReason.ABORT, 0.0)
    plan = sched.schedule(0.0)
    assert plan.finished_req_ids == (a.request_id,) and plan.preempted_req_ids == ()
    assert [n.req_id for n in plan.new_reqs] == [b.request_id]  # back: its data comes again
    assert plan.new_reqs[0].token_ids == tuple(b.token_ids) and len(b.token_ids) == 13


def test_decodes_are_rows_past_the_prompt_not_one_token_chunks():
    # a one-token prompt is a prefill; so is a one-token last chunk of a longer prompt
    engine = make_engine(budget=8, max_batch=4)
    rs = reqs([(0.0, 1, 3), (0.0, 9, 2)])
    result = engine.run(rs)
    first = next(result.steps.rows())
    assert first.decode_tokens == 0 and first.prefill_tokens == 8  # 1 + a 7-token chunk
    second = list(result.steps.rows())[1]
    assert second.decode_tokens == 1 and second.prefill_tokens == 2  # the rest of the 9-token prompt
    assert sum(s.decode_tokens for s in result.steps) == (3 - 1) + (2 - 1)


def test_the_plans_builders_take_every_field_by_name():
    """``new_step_plan`` and its siblings build the named tuples in C, positionally: each field
    must land where its name says (every value here is distinct)."""
    from paged_bench.core.plan import new_request_data, new_sampling_params, new_step_plan
    from paged_bench.core.plan import NewRequestData, SamplingParams

    sampling = dict(temperature=0.5, top_p=0.25, seed=3, max_tokens=4, ignore_eos=False)
    assert new_sampling_params(**sampling) == SamplingParams(**sampling)
    new = dict(req_id=1, token_ids=(2,), num_prompt_tokens=3, block_ids=(4,), num_computed_tokens=5,
               sampling=SamplingParams(**sampling))  # fmt: skip
    assert new_request_data(**new) == NewRequestData(**new)
    plan = dict(req_ids=(1,), num_computed_tokens=(2,), num_new_tokens=(3,),
                new_reqs=(NewRequestData(**new),), new_block_ids={1: (5,)}, partial_rows=frozenset({0}),
                num_decode_tokens=6, swap_out=((7, 8),), swap_in=((9, 10),), preempted_req_ids=(11,),
                finished_req_ids=(12,), window_step=13, idle_rows={14: 15})  # fmt: skip
    assert new_step_plan(**plan) == StepPlan(**plan) and type(new_step_plan(**plan)) is StepPlan


def test_starting_plans_drive_a_backend_directly():
    from paged_bench.core.plan import NewRequestData

    r = Request(3, 0.0, [1, 2, 3, 4, 5], 2)
    r.num_computed_tokens = 2
    plan = StepPlan.starting([(NewRequestData.from_request(r, [7, 8]), 2)])
    assert plan.req_ids == (3,) and plan.num_computed_tokens == (2,) and plan.partial_rows == frozenset({0})
    assert [row.samples for row in plan.rows()] == [False]


def test_a_backend_that_reads_no_tokens_gets_plans_without_them():
    engine = make_engine()  # the sim: a cost model needs counts only
    (r,) = reqs([(0.0, 40, 2)])
    engine.add_request(r)
    plan = engine.scheduler.schedule(0.0)
    assert plan.new_reqs[0].token_ids == () and plan.new_reqs[0].num_prompt_tokens == 40
    assert plan.num_new_tokens == (40,)


def test_requests_keep_plain_slot_attributes():
    # a __getattr__ (or __getattribute__) on Request makes CPython 3.11 give up its specialised
    # attribute loads for every request attribute: the hot loops ran 0.29 -> 0.40 us/seq-step
    assert "__getattr__" not in vars(Request) and Request.__getattribute__ is object.__getattribute__
