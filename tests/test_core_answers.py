"""The engine's reading of a backend's answer: cases the mutation check
(``benchmarks/mutation_core.py``) found no test for."""

from __future__ import annotations

from types import SimpleNamespace

from paged_bench.core.clock import VirtualClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import StepOutput
from paged_bench.core.request import Request
from paged_bench.core.scheduler.continuous import ContinuousScheduler
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
