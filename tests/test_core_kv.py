"""The KV allocators at the edges the mutation check (``benchmarks/mutation_core.py``) found
untested: what the ``Allocator`` base gives a plugin that implements only the abstract methods
(no swap: victims are recomputed), what ``leaks`` names, prefix hits after evictions (a copy of
a cached block evicted before the first, blocks held unhashed evicted one by one), a slab
allocator's layout and lookups, and the names the built-in plugins give themselves."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from paged_bench.backends.sim import SimBackend
from paged_bench.core.clock import VirtualClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.base import Allocator, KVLayout
from paged_bench.core.kv.block_pool import BlockPool
from paged_bench.core.kv.contiguous import ContiguousAllocator
from paged_bench.core.kv.free_queue import FreeQueue
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.request import FinishReason, Request
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from paged_bench.core.scheduler.preemptive import PreemptiveScheduler
from paged_bench.errors import ConfigError
from paged_bench.run import registry
from tests.test_core_behaviours import step

ABSTRACT = ("live_slots", "lookup_prefix", "allocate_slots", "free", "block_table", "num_free_blocks",
            "leaks")  # fmt: skip


def _forward(method: str):
    return lambda self, *args: getattr(self.inner, method)(*args)


def _wrap(self, **options) -> None:
    self.inner = PagedAllocator(**options)
    self.layout, self.counters = self.inner.layout, self.inner.counters  # attributes of the compiled base


# a plugin allocator that defines the abstract methods only, each handed to a paged allocator
NoSwap = type("NoSwap", (Allocator,), {
    "name": "noswap",
    "__init__": _wrap,
    "live_slots": property(lambda self: self.inner.live_slots),
    "num_free_blocks": property(lambda self: self.inner.num_free_blocks),
    **{m: _forward(m) for m in ABSTRACT if m not in ("live_slots", "num_free_blocks")},
})  # fmt: skip


def run(sched, rs: list[Request]):
    backend = SimBackend()
    backend.bind(sched.allocator)
    return Engine(sched, backend, VirtualClock()).run(rs)


def pressed(n: int = 4) -> list[Request]:
    """``n`` requests of 10 + 60 tokens, for a pool of 40 blocks of 4: preemption is needed."""
    return [Request(i, 0.001 * i, range(1000 * i, 1000 * i + 10), 60) for i in range(n)]


def test_an_allocator_that_cannot_swap_has_its_victims_recomputed():
    alloc = NoSwap(num_blocks=40, block_size=4)
    sched = PreemptiveScheduler(alloc, max_model_len=256, max_batch=8, max_num_batched_tokens=1024, mode="swap")
    rs = pressed()
    result = run(sched, rs)
    assert result.num_preemptions > 0 and result.swapped_blocks == 0 and result.recomputed_tokens > 0
    assert all(r.finish_reason is FinishReason.LENGTH for r in rs) and result.leaks == []


def test_an_allocators_cached_prefix_is_what_its_lookup_finds():
    alloc = NoSwap(num_blocks=40, block_size=4)
    run(ContinuousScheduler(alloc, max_model_len=256, max_batch=8, max_num_batched_tokens=1024), pressed(1))
    probe = Request("p", 0.0, range(10), 5)
    assert alloc.cached_prefix_tokens(probe) == alloc.lookup_prefix(probe).num_tokens == 8


def test_the_abstract_methods_named_are_those_a_plugin_must_define():
    assert set(Allocator.abstract_methods) == set(ABSTRACT)
    marked = getattr(Allocator, "__abstractmethods__", ())  # compiled, the marks are lost (hence the list)
    assert set(marked) in (set(), set(ABSTRACT))


def test_leaks_name_every_block_table_and_slot_still_held():
    alloc = PagedAllocator(num_blocks=8, block_size=4)
    sched = ContinuousScheduler(alloc, max_model_len=64, max_batch=2, max_num_batched_tokens=64)
    sched.add_request(Request("r", 0.0, range(6), 5), 0.0)
    sched.schedule(0.0)  # 6 tokens in 2 blocks, never freed
    leaks = alloc.leaks()
    assert any(m.startswith("2 KV blocks still referenced") for m in leaks)
    assert any(m.startswith("1 requests still hold block tables") for m in leaks)
    assert any(m.startswith("2 unfilled slots") for m in leaks)


def test_a_copy_evicted_before_the_first_leaves_no_stale_hit():
    """A (9 tokens: blocks a0, a1 full, a2) and B (8 tokens: hits a0, computes a copy of a1 in a
    block of its own, then finishes). The copy is evicted first, then a1: nothing holds A's
    second block any more, and a probe with A's prefix hits a0 only."""
    alloc = PagedAllocator(num_blocks=16, block_size=4)
    sched = ContinuousScheduler(alloc, max_model_len=64, max_batch=2, max_num_batched_tokens=64)
    a, b = Request("A", 0.0, [*range(8), 100], 20), Request("B", 0.0, range(8), 1)
    sched.add_request(a, 0.0)
    step(sched)
    sched.add_request(b, 0.0)
    step(sched)
    assert b.is_finished and b.num_cached_tokens == 4
    alloc.pool.get_new_blocks(alloc.num_free_blocks)  # every free block, B's copy (last freed) the last
    sched.finish_request(a, FinishReason.ABORT, 0.0)  # a2 to the free queue's head, a1 and a0 to its tail
    alloc.pool.get_new_blocks(2)  # a2 and a1
    assert alloc.cached_prefix_tokens(Request("P", 0.0, [*range(8), 7], 1)) == 4


@pytest.mark.parametrize("defer_unshared", [True, False])
@pytest.mark.parametrize("evicted", range(5))
def test_cached_blocks_evicted_one_by_one_leave_the_prefix_before_them(defer_unshared, evicted):
    """A 17-token request leaves blocks 0-3 cached (full) and block 4 free, in a pool of 6:
    the free queue is 4, 5, then A's blocks tail first (3, 2, 1, 0). Taking 2 + ``evicted``
    blocks evicts the last ``evicted`` of A's, and a probe with A's prompt hits the rest: the
    same whether the unshared chain's blocks were held unhashed or not."""
    alloc = PagedAllocator(num_blocks=6, block_size=4, defer_unshared=defer_unshared)
    sched = ContinuousScheduler(alloc, max_model_len=64, max_batch=2, max_num_batched_tokens=64)
    sched.add_request(Request("A", 0.0, range(17), 1), 0.0)
    step(sched)
    alloc.pool.get_new_blocks(2 + evicted)
    assert alloc.cached_prefix_tokens(Request("P", 0.0, range(17), 1)) == 16 - 4 * evicted


def test_a_slab_allocator_looks_nothing_up_and_has_no_swap_space():
    alloc = ContiguousAllocator(num_blocks=64, block_size=4, max_model_len=64)
    assert alloc.layout == KVLayout(64, 4, 0)
    sched = ContinuousScheduler(alloc, max_model_len=64, max_batch=4, max_num_batched_tokens=256)
    rs = [Request(i, 0.0, range(12), 3) for i in range(3)]  # one prompt: paged would hit it
    result = run(sched, rs)
    assert result.prefix_query_tokens == result.prefix_hit_tokens == 0 and result.leaks == []


@pytest.mark.parametrize(("options", "refusal"), [
    ({"num_blocks": 0}, "num_blocks=0 is not allowed: an integer >= 1"), ({"block_size": 0}, "block_size=0"),
    ({"max_model_len": 0}, "max_model_len=0"),
])  # fmt: skip
def test_bad_slab_options_name_the_key(options, refusal):
    # a pool too small for one slab is refused as the engine sizes it (test_allocators)
    with pytest.raises(ConfigError, match=refusal):
        registry.create("allocator", "contiguous", **{"num_blocks": 64, "block_size": 4, "max_model_len": 64, **options})


def test_an_interrupt_inside_a_swap_out_leaves_the_swap_space_whole():
    """Swap blocks taken for a victim, then the signal, before its table records them."""

    class Torn(BlockPool):  # an override: the compiled allocator calls the pool's methods directly
        def get_new_blocks(self, n):
            super().get_new_blocks(n)
            raise KeyboardInterrupt

    alloc = PagedAllocator(num_blocks=40, block_size=4)
    alloc.cpu_pool = Torn(alloc.layout.num_cpu_blocks)
    sched = PreemptiveScheduler(alloc, max_model_len=256, max_batch=8, max_num_batched_tokens=1024, mode="swap")
    result = run(sched, pressed())
    assert result.interrupted and result.leaks == [] and alloc.cpu_pool.held_blocks() == []


def test_an_empty_free_queue_takes_blocks_at_either_end():
    queue = FreeQueue(2, queued=[])
    assert len(queue) == 0 and queue.blocks() == []
    queue.appendleft(1)
    queue.appendleft(0)
    assert queue.blocks() == [0, 1] and queue.popleft() == 0 and len(queue) == 1


@pytest.mark.parametrize("group", ["paged_bench.schedulers", "paged_bench.allocators"])
def test_the_built_in_plugins_name_themselves_as_the_config_does(group):
    """Errors and records name a policy or an allocator by its ``name``: the config's."""
    built_in = [ep for ep in entry_points(group=group) if ep.value.startswith("paged_bench.")]
    assert built_in and all(ep.load().name == ep.name for ep in built_in)
