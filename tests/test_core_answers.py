"""The engine's reading of a backend's answer, and the block pool's index as copies come and
go: cases the mutation check (``benchmarks/mutation_core.py``) found no test for."""

from __future__ import annotations

from types import SimpleNamespace

from paged_bench.core.clock import VirtualClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.block_pool import BlockPool
from paged_bench.core.kv.contiguous import ContiguousAllocator
from paged_bench.core.kv.deferred_hashing import DeferredHashingPool
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


def test_an_evicted_cached_block_hands_the_index_to_its_first_copy_then_the_next():
    """As vLLM's ``BlockHashToBlockMap``: a hit takes the first indexed block of a hash; evicting
    it promotes the copies in the order they were indexed; the last one evicted leaves no entry."""
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, ["h", "h", "h"])
    pool.free_blocks(blocks)  # free, still cached: the queue is 3, then 0, 1, 2 (cached: at the tail)
    assert pool.get_cached_block("h") == blocks[0] and pool.num_cached_blocks == 3
    pool.get_new_blocks(2)  # block 3, then blocks[0] (evicted)
    assert pool.get_cached_block("h") == blocks[1] and pool.num_cached_blocks == 2
    pool.get_new_blocks(2)  # blocks[1] and blocks[2]
    assert pool.get_cached_block("h") is None and pool.num_cached_blocks == 0
    assert pool.cached == {} and pool.copies == {}  # nothing kept for a hash no block holds


def test_evicting_a_copy_keeps_the_first_indexed_block():
    pool = BlockPool(3)
    first, copy = pool.get_new_blocks(2)
    pool.cache_full_blocks([first, copy], ["h", "h"])
    pool.free_blocks([copy])  # the copy alone is free: the next allocation takes block 2, then it
    pool.get_new_blocks(2)
    assert pool.get_cached_block("h") == first and pool.num_cached_blocks == 1 and pool.copies == {}


def test_a_slab_refused_for_want_of_room_leaves_no_table_behind():
    alloc = ContiguousAllocator(num_blocks=40, block_size=16, max_model_len=512)  # one slab
    first, second = Request(0, 0.0, range(10), 8), Request(1, 0.0, range(5), 8)
    assert alloc.allocate_slots(first, 10) is not None
    assert alloc.allocate_slots(second, 5) is None  # no slab left: refused, changing nothing
    first.num_computed_tokens = 10
    alloc.free(first)
    assert alloc.leaks() == [] and alloc.num_free_blocks == 40


def test_a_chain_held_by_its_request_counts_only_its_indexed_root_as_cached():
    """While its table is held, a deferred chain's blocks past the root are the request's, not
    the cache's; released, they are cached (deferred); evicted, nothing of the chain remains."""
    pool = DeferredHashingPool(4)
    blocks = pool.get_new_blocks(3)
    pool.cache_chain(blocks[:1], ["root"], "root")
    run = pool.open_run("root", "its tokens", blocks)
    assert pool.num_cached_blocks == 1 and run.num_live == 0
    pool.defer(run, 3)
    pool.free_blocks(reversed(blocks))
    assert pool.num_cached_blocks == 3
    pool.get_new_blocks(4)
    assert pool.num_cached_blocks == 0 and pool.block_root == [None] * 4 and pool.block_hash == [None] * 4
