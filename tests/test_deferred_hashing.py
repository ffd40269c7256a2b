"""Deferred hashing (``paged_bench.core.kv.deferred_hashing``): a chain no other chain shares
is held in the cache unhashed, and indexed the moment another chain shows its root, so that
what hits and what is evicted is what hashing every block gives (the property test
``test_deferred_hashing_caches_exactly_as_hashing_every_block`` compares the two step by step)."""

from __future__ import annotations

import pytest

from paged_bench.core.kv.deferred_hashing import DeferredHashingPool
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.request import Request

ROOT = "root"


def held_run(pool: DeferredHashingPool, n: int):
    """A chain of ``n`` blocks: its root indexed, the rest deferred once its table is released."""
    blocks = pool.get_new_blocks(n)
    pool.cache_chain(blocks[:1], [ROOT], ROOT)
    run = pool.open_run(ROOT, "its tokens", blocks)
    pool.defer(run, n)
    pool.free_blocks(reversed(blocks))
    return run, blocks


def test_deferred_blocks_stay_cached_unhashed_and_are_evicted_in_turn():
    pool = DeferredHashingPool(4)
    run, blocks = held_run(pool, 3)
    assert pool.num_free == 4 and pool.num_cached_blocks == 3  # root indexed, two blocks deferred
    assert list(pool.cached) == [ROOT] and pool.root_known(ROOT)
    assert pool.get_new_blocks(1) == [3]  # the block that held nothing goes first
    assert pool.get_new_blocks(1) == [blocks[2]]  # then the chain's tail (released tail first)
    assert run.num_live == 1 and pool.num_evictions == 1 and pool.num_cached_blocks == 2
    pool.get_new_blocks(2)  # its last deferred block, then the root
    assert pool.num_cached_blocks == 0 and not pool.root_known(ROOT) and pool.num_evictions == 3


def test_indexing_a_run_indexes_only_the_blocks_still_cached():
    pool = DeferredHashingPool(5)
    run, blocks = held_run(pool, 4)
    pool.get_new_blocks(2)  # the free block, then the chain's tail block
    pool.index_deferred(run, [ROOT, "h1", "h2", "h3"])
    assert pool.cached == {ROOT: blocks[0], "h1": blocks[1], "h2": blocks[2]}
    assert pool.roots == {ROOT: 3} and pool.num_cached_blocks == 3
    assert pool.deferred == {}  # the run is gone: its blocks answer by hash now


def test_a_root_is_known_while_any_block_of_its_chains_is_cached():
    pool = DeferredHashingPool(3)
    (block,) = pool.get_new_blocks(1)
    pool.cache_chain([block], [ROOT], ROOT)
    pool.free_blocks([block])
    assert pool.root_known(ROOT)
    pool.get_new_blocks(3)
    assert not pool.root_known(ROOT) and pool.roots == {}


@pytest.mark.parametrize("defer_unshared", [True, False])
def test_a_later_request_hits_a_deferred_chain_whole(defer_unshared):
    """The first chain's blocks past its root were never hashed (deferred); the second
    request's lookup shows the same root, which indexes them first: it hits all of them."""
    alloc = PagedAllocator(num_blocks=16, block_size=4, defer_unshared=defer_unshared)
    first = Request(0, 0.0, list(range(13)), 2)  # three full blocks and one token
    assert alloc.allocate_slots(first, 13, alloc.lookup_prefix(first)) is not None
    assert len(alloc.pool.cached) == (1 if defer_unshared else 3)  # deferred: only the root hashed
    first.num_computed_tokens = 13
    alloc.free(first)
    again = Request(1, 0.0, list(range(13)), 2)
    assert alloc.lookup_prefix(again).num_tokens == 12
    assert len(alloc.pool.cached) == 3
