"""The block pool and its free queue: blocks handed out least recently freed first, uncached
ones evicted before cached ones, a cached block revived in O(1), the queue's order as an
ordered dict keeps it, and a torn queue made whole."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from paged_bench.core.kv.block_pool import BlockPool
from paged_bench.core.kv.free_queue import FreeQueue


def test_pool_allocates_least_recently_freed_and_reuses_freed_blocks_at_once():
    pool = BlockPool(4)
    a = pool.get_new_blocks(4)
    assert pool.num_free == 0
    for b in a:
        pool.free_blocks([b])
    assert pool.num_free == 4
    # all uncached: freed blocks are reusable immediately
    assert sorted(pool.get_new_blocks(4)) == sorted(a)


def test_pool_evicts_uncached_blocks_before_cached_ones():
    pool = BlockPool(3)
    b0, b1, b2 = pool.get_new_blocks(3)
    pool.cache_full_blocks([b0], [111])
    for b in (b0, b1, b2):
        pool.free_blocks([b])
    got = pool.get_new_blocks(2)
    assert b0 not in got  # the cached block survives while worthless blocks remain
    assert pool.get_cached_block(111) == b0
    assert pool.get_new_blocks(1) == [b0]  # now it must go: its hash is dropped
    assert pool.get_cached_block(111) is None and pool.num_cached_blocks == 0 and pool.num_evictions == 1


def test_pool_touch_revives_a_free_cached_block_in_o1():
    pool = BlockPool(2)
    (b,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([b], [7])
    pool.free_blocks([b])
    assert pool.is_free(b)
    assert pool.touch(b) is True and pool.num_free == 1
    assert pool.touch(b) is False and pool.ref_cnt[b] == 2


def test_a_copy_of_a_cached_block_takes_its_place_when_the_first_is_evicted():
    pool = BlockPool(2)
    first, copy = pool.get_new_blocks(2)
    pool.cache_full_blocks([first], [5])
    pool.cache_full_blocks([copy], [5])  # the same content, recomputed
    assert pool.get_cached_block(5) == first and pool.num_cached_blocks == 2
    pool.free_blocks([first])
    assert pool.get_new_blocks(1) == [first]  # evicted: the copy answers for the content now
    assert pool.get_cached_block(5) == copy and pool.num_cached_blocks == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["popleft", "append", "appendleft", "remove"]), st.integers(0, 7))))
def test_free_queue_keeps_the_order_an_ordered_dict_does(ops):
    # the OrderedDict the pool's queue replaced is the model: same head, same order, same size
    queue, model = FreeQueue(8), OrderedDict.fromkeys(range(8))
    for op, block in ops:
        if op == "popleft":
            if model:
                assert queue.popleft() == model.popitem(last=False)[0]
        elif op == "remove":
            if block in model:
                queue.remove(block)
                del model[block]
        elif block not in model:
            getattr(queue, op)(block)
            model[block] = None
            if op == "appendleft":
                model.move_to_end(block, last=False)
        assert queue.blocks() == list(model) and len(queue) == len(model)


class TornQueue(FreeQueue):
    """A queue an interrupt tore inside a pointer move: the walk from block 3 loops at block 4."""

    def blocks(self):
        return [0, 3, 4, 4, 4, 4]


def test_reclaim_makes_a_torn_queue_whole_in_its_order():
    pool = BlockPool(6)
    held = pool.get_new_blocks(3)  # blocks 0-2 held, 3-5 free
    pool.free_blocks([held[0]])
    pool.free_queue = TornQueue(6, [0, 3, 4, 5])
    pool.reclaim()
    assert pool.free_queue.blocks() == [0, 3, 4, 1, 2, 5] and pool.num_free == 6 and pool.held_blocks() == []
