"""The KV allocators: on-demand paging, prefix caching, swap, slabs (the block pool: test_block_pool)."""

from __future__ import annotations

import pytest

from paged_bench.core.kv.base import NO_HIT
from paged_bench.core.kv.contiguous import ContiguousAllocator
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.request import Request
from paged_bench.errors import ConfigError
from paged_bench.run import registry
from paged_bench.run.bench import build
from paged_bench.run.compose import compose_config


def req(rid: int, tokens: list[int], max_tokens: int = 8) -> Request:
    return Request(rid, 0.0, list(tokens), max_tokens)


def admit(alloc: PagedAllocator, r: Request, n: int | None = None) -> int:
    """Admit ``r`` the way the scheduler does; returns the prefix hit in tokens."""
    hit = alloc.lookup_prefix(r)
    n = r.num_tokens - hit.num_tokens if n is None else n
    assert alloc.allocate_slots(r, n, hit) is not None
    r.num_computed_tokens = hit.num_tokens
    return hit.num_tokens


def compute(r: Request, n: int) -> None:
    """What a step does to a request: its n tokens get computed."""
    r.num_computed_tokens += n


def decode_next(alloc: PagedAllocator, r: Request) -> None:
    """The next step's decode: a sampled token, and room for it (which also indexes the
    blocks the previous step filled, as the scheduler's first pass of a step does)."""
    r.token_ids.append(0)
    assert alloc.allocate_slots(r, 1) is not None


# -- paged allocator ----------------------------------------------------------------------


def test_blocks_are_handed_out_on_demand_as_the_sequence_grows():
    alloc = PagedAllocator(num_blocks=10, block_size=4, prefix_caching=False)
    r = req(0, range(6))
    assert alloc.allocate_slots(r, 6) == tuple(alloc.block_table(r))  # a new table: every block is new
    assert len(alloc.block_table(r)) == 2  # 6 tokens -> 2 blocks of 4
    assert alloc.live_slots == 6 and alloc.reserved_slots == 8
    compute(r, 6)
    r.token_ids.append(99)  # sampled token 7 fits block 2
    assert alloc.allocate_slots(r, 1) == ()
    assert len(alloc.block_table(r)) == 2
    compute(r, 1)
    r.token_ids.append(99)  # token 8 fills block 2
    assert alloc.allocate_slots(r, 1) == ()
    compute(r, 1)
    r.token_ids.append(99)  # token 9 needs block 3: the blocks appended are returned
    new = alloc.allocate_slots(r, 1)
    assert new is not None and len(new) == 1 and alloc.block_table(r)[2:] == list(new)
    assert len(alloc.block_table(r)) == 3 and alloc.live_slots == 9 and alloc.reserved_slots == 12


def test_allocation_fails_without_side_effects_when_the_pool_is_short():
    alloc = PagedAllocator(num_blocks=3, block_size=4, prefix_caching=False)
    a, b = req(0, range(8)), req(1, range(5))
    admit(alloc, a)
    assert alloc.allocate_slots(b, 5) is None  # needs 2 blocks, 1 free
    assert alloc.num_free_blocks == 1 and alloc.live_slots == 8
    assert alloc.allocate_slots(b, 4) is not None  # a chunk that fits one block
    assert alloc.num_free_blocks == 0


def test_min_free_blocks_is_a_watermark_at_admission():
    alloc = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=False)
    r = req(0, range(8))
    assert alloc.allocate_slots(r, 8, min_free_blocks=3) is None
    assert alloc.allocate_slots(r, 8, min_free_blocks=2) is not None


def test_free_returns_everything_and_leaves_no_leak():
    alloc = PagedAllocator(num_blocks=8, block_size=4)
    r = req(0, range(10))
    admit(alloc, r)
    compute(r, 10)
    alloc.free(r)
    alloc.free(r)  # idempotent
    assert alloc.num_free_blocks == 8 and alloc.live_slots == 0 and alloc.leaks() == []


def test_prefix_cache_reuses_the_longest_cached_chain_of_full_blocks():
    alloc = PagedAllocator(num_blocks=16, block_size=4)
    shared = list(range(100, 110))  # 2 full blocks + 2 tokens
    a = req(0, shared + [1, 2, 3])
    admit(alloc, a)
    compute(a, a.num_tokens)
    decode_next(alloc, a)
    b = req(1, shared + [7, 8, 9, 10, 11, 12])
    assert admit(alloc, b) == 8  # two full shared blocks; the third differs
    assert alloc.block_table(b)[:2] == alloc.block_table(a)[:2]
    assert alloc.counters.prefix_hit_tokens == 8
    # shared blocks are counted once in live and reserved slots
    assert alloc.reserved_slots == (4 + 2) * 4
    assert alloc.live_slots == 14 + 16 - 8


def test_a_block_is_shared_as_soon_as_it_is_allocated_for_computation():
    # vLLM v1 caches full blocks at allocate_slots: a request admitted later in the same step
    # already hits them (the step writes all new K/V before any attention reads it)
    alloc = PagedAllocator(num_blocks=16, block_size=4)
    a = req(0, list(range(12)))
    admit(alloc, a)  # allocated for this step, not yet computed
    b = req(1, list(range(12)) + [5])
    assert alloc.lookup_prefix(b).num_tokens == 12


def test_blocks_released_before_their_step_ran_are_not_shared():
    alloc = PagedAllocator(num_blocks=16, block_size=4)
    a = req(0, list(range(12)))
    admit(alloc, a)
    alloc.free(a)  # preempted (or the step failed) before a's K/V was written
    assert alloc.lookup_prefix(req(1, list(range(12)) + [5])).num_tokens == 0
    assert alloc.pool.num_cached_blocks == 0 and alloc.leaks() == []


def test_only_the_uncomputed_blocks_of_a_released_table_are_dropped():
    alloc = PagedAllocator(num_blocks=16, block_size=4)
    a = req(0, list(range(8)))
    admit(alloc, a)
    compute(a, 8)  # blocks 0-1 computed
    a.token_ids.extend(range(8, 12))
    assert alloc.allocate_slots(a, 4) is not None  # block 2 indexed for this step
    alloc.free(a)  # preempted before the step ran
    assert alloc.lookup_prefix(req(1, list(range(12)) + [5])).num_tokens == 8


def test_prefix_hit_leaves_the_last_token_to_compute():
    alloc = PagedAllocator(num_blocks=8, block_size=4)
    a = req(0, range(8))
    admit(alloc, a)
    compute(a, 8)
    alloc.free(a)
    again = req(1, range(8))  # identical prompt, both blocks cached
    assert alloc.lookup_prefix(again).num_tokens == 4  # not 8: something must be sampled


def test_freed_cached_blocks_are_revived_and_evicted_tail_first():
    alloc = PagedAllocator(num_blocks=4, block_size=2)
    a = req(0, range(8))  # 4 full blocks
    admit(alloc, a)
    compute(a, 8)
    table = list(alloc.block_table(a))
    alloc.free(a)
    assert alloc.num_free_blocks == 4 and alloc.pool.num_cached_blocks == 4
    # a new unrelated request of one block evicts a's tail block first
    other = req(1, [50, 51])
    admit(alloc, other)
    assert alloc.block_table(other) == [table[-1]]
    # a's first blocks are still revivable (at most 5 of 6 tokens come from the cache)
    again = req(2, list(range(6)))
    assert admit(alloc, again) == 4
    assert alloc.block_table(again)[:2] == table[:2]


def test_caching_off_never_hits():
    alloc = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=False)
    a = req(0, range(9))
    admit(alloc, a)
    compute(a, 9)
    alloc.free(a)
    assert admit(alloc, req(1, range(9))) == 0
    assert alloc.pool.num_cached_blocks == 0


def test_swap_out_and_in_moves_computed_blocks_and_accounts_them():
    alloc = PagedAllocator(num_blocks=4, block_size=4, swap_blocks=2)
    r = req(0, range(7))
    admit(alloc, r)
    compute(r, 7)
    gpu_table = list(alloc.block_table(r))
    pairs = alloc.swap_out(r)
    assert [g for g, _ in pairs] == gpu_table
    assert alloc.num_free_blocks == 4 and alloc.live_slots == 0
    assert alloc.cpu_pool.num_free == 0
    r.token_ids.append(1)
    back = alloc.swap_in(r, 1)
    assert [c for c, _ in back] == [c for _, c in pairs]
    assert alloc.block_table(r) == [g for _, g in back]
    assert alloc.cpu_pool.num_free == 2 and alloc.live_slots == 8
    alloc.free(r)
    assert alloc.leaks() == []


def test_swap_out_refuses_when_swap_space_is_full():
    alloc = PagedAllocator(num_blocks=4, block_size=4, swap_blocks=1)
    r = req(0, range(8))
    admit(alloc, r)
    compute(r, 8)
    assert alloc.swap_out(r) is None
    assert len(alloc.block_table(r)) == 2  # untouched


def test_bad_allocator_options_name_the_key():
    with pytest.raises(ConfigError, match="block_size=0"):
        registry.create("allocator", "paged", num_blocks=4, block_size=0)
    with pytest.raises(ConfigError, match="allocator.prefix_caching"):
        registry.create("allocator", "paged", num_blocks=4, block_size=4, prefix_caching="yes")


# -- contiguous -----------------------------------------------------------------------------


def test_contiguous_reserves_a_max_model_len_slab_per_request_from_the_same_memory():
    alloc = ContiguousAllocator(num_blocks=64, block_size=16, max_model_len=256)  # 1024 slots
    # the layout speaks in blocks, as paged's: a slab is 16 consecutive blocks
    assert alloc.layout.num_blocks == 64 and alloc.layout.block_size == 16
    r = req(0, range(10))
    admit(alloc, r)
    assert alloc.reserved_slots == 256 and alloc.live_slots == 10 and alloc.num_free_blocks == 48
    table = list(alloc.block_table(r))
    assert len(table) == 16 and table == list(range(table[0], table[0] + 16))
    compute(r, 10)
    for _ in range(200):  # grows within its slab, never needs another
        r.token_ids.append(0)
        assert alloc.allocate_slots(r, 1) == ()
        compute(r, 1)
    assert alloc.block_table(r) == table


def test_contiguous_admission_waits_for_a_free_slab():
    alloc = ContiguousAllocator(num_blocks=32, block_size=16, max_model_len=256)  # 2 slabs
    a, b, c = (req(i, range(5)) for i in range(3))
    admit(alloc, a)
    admit(alloc, b)
    assert alloc.allocate_slots(c, 5) is None
    alloc.free(a)
    assert alloc.allocate_slots(c, 5) == tuple(alloc.block_table(c))  # the slab's blocks, as the layout counts them


def test_contiguous_needs_room_for_one_slab():
    with pytest.raises(ConfigError, match="num_blocks"):
        build(compose_config("allocator=contiguous", "num_blocks=2", "block_size=16", "max_model_len=512"))


def test_contiguous_keeps_the_configured_memory_when_it_is_not_a_whole_number_of_slabs():
    alloc = ContiguousAllocator(num_blocks=40, block_size=16, max_model_len=512)  # one slab of 32, 8 left over
    assert alloc.layout.num_blocks == 40 and alloc.num_free_blocks == 40
    r = req(0, range(10))
    admit(alloc, r)
    assert alloc.reserved_slots == 512 and alloc.num_free_blocks == 8  # the tail is never handed out
    assert alloc.allocate_slots(req(1, range(5)), 5) is None
    alloc.free(r)
    assert alloc.num_free_blocks == 40 and alloc.reserved_slots == 0


@pytest.mark.parametrize("defer_unshared", [True, False])
def test_a_recomputed_copy_of_a_cached_block_is_indexed_and_outlives_the_first(defer_unshared):
    """vLLM's BlockHashToBlockMap keeps both copies of a block's content: when the first is
    evicted, the copy still hits."""
    alloc = PagedAllocator(num_blocks=16, block_size=4, defer_unshared=defer_unshared)
    a = Request(0, 0.0, [*range(8), 100], 2)  # two full blocks and one token
    assert alloc.allocate_slots(a, 9, alloc.lookup_prefix(a)) is not None
    b = Request(1, 0.0, list(range(8)), 2)  # the same two blocks: hits the first, recomputes the second
    hit = alloc.lookup_prefix(b)
    assert hit.num_tokens == 4
    assert alloc.allocate_slots(b, 4, hit) == (alloc.block_table(b)[1],)  # the hit's block is not new
    b.num_computed_tokens = 8
    first_copy = alloc.block_table(a)[1]
    alloc.free(a)  # its second block waits at the free queue's tail, cached
    evicted = alloc.pool.get_new_blocks(alloc.pool.num_free)  # the pool runs dry: every free block is taken
    assert first_copy in evicted
    c = Request(2, 0.0, [*range(8), 7], 2)
    assert alloc.lookup_prefix(c).blocks == (alloc.block_table(b)[0], alloc.block_table(b)[1])


def test_an_interpreted_allocator_on_the_compiled_base_runs_as_the_paged_one_does():
    """A plugin allocator derived from ``Allocator`` itself (interpreted, on a compiled base):
    the compiled scheduler calls its methods and properties, and the base's own methods
    (``free_all``, ``reserved_slots``) call its overrides. Here it hands every call to a
    ``PagedAllocator``, so the run must be the paged run, step for step."""
    from paged_bench.core.kv.base import Allocator
    from tests.test_schedulers import make_engine, reqs

    class Delegating(Allocator):
        name = "delegating"

        def __init__(self, inner: PagedAllocator) -> None:
            self.inner, self.layout, self.counters = inner, inner.layout, inner.counters
            self.calls = 0

        @property
        def live_slots(self):
            return self.inner.live_slots

        def lookup_prefix(self, req):
            return self.inner.lookup_prefix(req)

        def allocate_slots(self, req, num_new_tokens, hit=NO_HIT, min_free_blocks=0):
            self.calls += 1
            return self.inner.allocate_slots(req, num_new_tokens, hit, min_free_blocks)

        def free(self, req):
            self.inner.free(req)

        def block_table(self, req):
            return self.inner.block_table(req)

        @property
        def num_free_blocks(self):
            return self.inner.num_free_blocks

        def leaks(self):
            return self.inner.leaks()

    def run(allocator):
        rs = reqs([(0.002 * i, 6 + i % 5, 3 + i % 7) for i in range(24)])
        return make_engine(num_blocks=24, allocator=allocator).run(rs)

    mine = Delegating(PagedAllocator(num_blocks=24, block_size=4))
    ours, theirs = run(mine), run(PagedAllocator(num_blocks=24, block_size=4))
    assert mine.calls > 24  # every row's allocation reached the override
    assert list(ours.steps.rows()) == list(theirs.steps.rows())
    assert ours.leaks == theirs.leaks == [] and mine.reserved_slots == 0
