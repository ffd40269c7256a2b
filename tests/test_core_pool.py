"""The KV allocators' and the block pool's bookkeeping where only memory or a later
operation shows it: the index handed to copies, a refused slab, swapped tables freed and
counted, a probe that leaves nothing behind. (Cases the mutation check,
``benchmarks/mutation_core.py``, found no test for.)"""

from __future__ import annotations

import tracemalloc

from paged_bench.core.kv.block_pool import BlockPool
from paged_bench.core.kv.contiguous import ContiguousAllocator
from paged_bench.core.kv.deferred_hashing import DeferredHashingPool
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.request import Request


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


def swapped(alloc: PagedAllocator) -> Request:
    """A request whose 8 computed tokens were swapped out to the CPU pool (2 blocks of 4)."""
    req = Request(0, 0.0, range(8), 4)
    assert alloc.allocate_slots(req, 8) is not None
    req.num_computed_tokens = 8
    assert alloc.swap_out(req) is not None
    return req


def test_a_swapped_table_freed_returns_its_swap_blocks_and_until_then_is_a_leak():
    alloc = PagedAllocator(num_blocks=8, block_size=4, swap_blocks=4)
    req = swapped(alloc)
    assert "2 swap blocks still held" in alloc.leaks() and alloc.num_free_blocks == 8
    alloc.free(req)  # aborted while swapped out
    assert alloc.leaks() == [] and alloc.cpu_pool.held_blocks() == [] and alloc.num_free_blocks == 8


def test_swap_in_takes_the_whole_room_left_when_no_watermark_is_asked():
    alloc = PagedAllocator(num_blocks=3, block_size=4, swap_blocks=4)
    req = swapped(alloc)
    assert alloc.swap_in(req, 1) is not None  # 8 tokens back and the next: all 3 blocks
    assert alloc.num_free_blocks == 0 and alloc.cpu_pool.held_blocks() == []


def test_probing_requests_it_does_not_hold_leaves_nothing_behind():
    """A router asks every replica what it has cached of each request it routes: the hash
    chain a probe computes is forgotten unless the allocator holds the request."""
    alloc = PagedAllocator(num_blocks=64, block_size=16)
    probes = [Request(i, 0.0, range(i, i + 64), 1) for i in range(2000)]
    alloc.cached_prefix_tokens(probes[0])
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    assert all(alloc.cached_prefix_tokens(probe) == 0 for probe in probes)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 50_000, grown  # a chain of 4 hashes kept per probe would be ~1 MB


def test_hashing_is_deferred_by_default():
    alloc = PagedAllocator(num_blocks=16, block_size=4)
    req = Request(0, 0.0, range(13), 2)  # three full blocks
    assert alloc.allocate_slots(req, 13) is not None
    assert len(alloc.pool.cached) == 1  # the chain's root alone: the rest waits for a second chain


def test_a_token_that_fits_the_last_block_needs_no_room_beyond_it():
    """A watermark guards new blocks: a row whose next token fits the block it has is granted
    whatever is free (as vLLM's allocate_slots asks for no block then)."""
    alloc = PagedAllocator(num_blocks=2, block_size=4)
    req = Request(0, 0.0, range(3), 4)
    assert alloc.allocate_slots(req, 3) is not None
    req.num_computed_tokens = 3
    req.token_ids.append(0)  # the token its prefill sampled
    assert alloc.allocate_slots(req, 1, min_free_blocks=100) == ()


def test_a_finished_requests_hash_chain_is_forgotten_with_its_table():
    alloc = PagedAllocator(num_blocks=64, block_size=16)
    reqs = [Request(i, 0.0, range(i, i + 64), 1) for i in range(1001)]
    tracemalloc.start()
    for i, req in enumerate(reqs):
        if i == 1:
            before = tracemalloc.get_traced_memory()[0]
        assert alloc.allocate_slots(req, 64) is not None
        req.num_computed_tokens = 64
        alloc.free(req)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 100_000, grown  # a chain of hashes kept per request would be ~0.5 MB
