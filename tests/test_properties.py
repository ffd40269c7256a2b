"""Property tests: random workloads x schedulers x allocators x block sizes.

Whatever the mix: every request finishes with exactly its output length (or the run
stops with a clear error, non-preemptive policies only); no block leaks and every
reference count returns to zero; live <= reserved <= capacity at every step, with the pool's
bookkeeping consistent; a backend that mirrors requests from the step plans alone sees
exactly the scheduler's tokens and the allocator's block tables; and a virtual-time run is
bit-for-bit reproducible.
"""

from __future__ import annotations

from dataclasses import astuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged_bench.backends.request_state import RequestStates
from paged_bench.backends.sim import SimBackend
from paged_bench.core.clock import VirtualClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.contiguous import ContiguousAllocator
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.request import FinishReason, Request
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from paged_bench.core.scheduler.preemptive import VICTIMS, PreemptiveScheduler
from paged_bench.core.scheduler.static import StaticScheduler

MAX_MODEL_LEN = 128
POLICIES = ["static", "continuous", "recompute", "swap"]


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 20))
    shared = draw(st.lists(st.integers(0, 50), min_size=8, max_size=40)) if draw(st.booleans()) else []
    specs = []
    t = 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.001, 0.01, 0.1]))
        prompt = shared[: draw(st.integers(0, len(shared)))] + draw(st.lists(st.integers(0, 50), min_size=1, max_size=40))
        specs.append((t, prompt[: MAX_MODEL_LEN - 1], draw(st.integers(1, 100))))
    return dict(
        specs=specs,
        policy=draw(st.sampled_from(POLICIES)),
        allocator=draw(st.sampled_from(["paged", "paged-nocache", "contiguous"])),
        block_size=draw(st.sampled_from([1, 2, 4, 16])),
        victim=draw(st.sampled_from(VICTIMS)),
        max_batch=draw(st.integers(1, 8)),
        budget=draw(st.sampled_from([8, 64, 1024])),
        # from "barely one sequence" to "no pressure at all"
        pool_tokens=draw(st.sampled_from([MAX_MODEL_LEN, 2 * MAX_MODEL_LEN, 16 * MAX_MODEL_LEN])),
        # vLLM 0.x's prompt-only steps (whole prompts: with a budget that holds one) and 0.6's multi-step
        prefill_first=draw(st.booleans()),
        num_scheduler_steps=draw(st.sampled_from([1, 1, 4])),
    )


def build(s) -> tuple[Engine, list[Request]]:
    bs = s["block_size"]
    num_blocks = -(-s["pool_tokens"] // bs)
    if s["allocator"] == "contiguous":
        alloc = ContiguousAllocator(num_blocks=num_blocks, block_size=bs, max_model_len=MAX_MODEL_LEN)
    else:
        alloc = PagedAllocator(num_blocks=num_blocks, block_size=bs, prefix_caching=s["allocator"] == "paged",
                               swap_blocks=num_blocks // 2)
    prefill_first = s["prefill_first"] and s["budget"] >= MAX_MODEL_LEN
    common = dict(max_model_len=MAX_MODEL_LEN, max_batch=s["max_batch"], max_num_batched_tokens=s["budget"],
                  prefill_first=prefill_first, chunked_prefill=not prefill_first,
                  num_scheduler_steps=s["num_scheduler_steps"])  # fmt: skip
    policy = s["policy"]
    if policy in ("recompute", "swap"):
        sched = PreemptiveScheduler(alloc, mode=policy, victim=s["victim"], **common)
    else:
        sched = (StaticScheduler if policy == "static" else ContinuousScheduler)(alloc, **common)
    requests = [Request(i, t, list(p), o) for i, (t, p, o) in enumerate(s["specs"])]
    backend = MirroringSim(sched, {r.request_id: r for r in requests})
    backend.bind(alloc)
    return Engine(sched, backend, VirtualClock()), requests


class MirroringSim(SimBackend):
    """The sim, plus what a real backend keeps from the plans alone, checked against the
    scheduler's requests and the allocator's tables at every step (the step contract)."""

    reads_token_ids = True

    def __init__(self, sched, by_id) -> None:
        super().__init__()
        self.sched, self.by_id, self.states = sched, by_id, RequestStates()

    def execute(self, plan):
        states = self.states.apply(plan)
        for row, state in zip(plan.rows(), states):
            req = self.by_id[row.req_id]
            assert state.token_ids == req.token_ids.tolist() and row.num_computed_tokens == req.num_computed_tokens
            assert state.block_ids == list(self.sched.allocator.block_table(req))
            assert row.samples == (row.num_computed_tokens + row.num_new_tokens == req.num_tokens)
        # a request that ended inside a multi-step window is let go at the window's end
        let_go_later = {r.request_id for r in self.sched._window_done}
        assert set(self.states.by_id) <= {r.request_id for r in self.sched.running} | let_go_later
        output = super().execute(plan)
        self.states.record_samples(plan, states, output.token_ids)
        return output


def check_pool(engine: Engine) -> None:
    alloc = engine.allocator
    cap = alloc.capacity_slots
    assert 0 <= alloc.live_slots <= alloc.reserved_slots <= cap
    pool = alloc.pool
    queued = pool.free_queue.blocks()
    free = set(queued)
    assert len(queued) == len(free) == pool.num_free  # each free block queued once, and counted
    assert all((pool.ref_cnt[b] == 0) == (b in free) for b in range(pool.num_blocks))
    assert all(pool.block_hash[b] == h for h, b in pool.cached.items())
    per_pool_block = getattr(alloc, "blocks_per_slab", 1)  # a contiguous slab is one pool block
    for req in engine.scheduler.running:
        assert all(pool.ref_cnt[b // per_pool_block] > 0 for b in alloc.block_table(req))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_finishes_exactly_and_the_pool_is_whole(s):
    engine, requests = build(s)
    result = engine.run(requests, on_step=lambda now, finished: check_pool(engine))
    for row in result.steps:
        assert 0 <= row.kv_live_slots <= row.kv_reserved_slots <= engine.allocator.capacity_slots
    assert result.leaks == []
    assert all(n == 0 for n in engine.allocator.pool.ref_cnt)
    assert engine.allocator.num_free_blocks == engine.allocator.layout.num_blocks
    if result.error is not None:
        # only a policy that never preempts may stop early, and only for a dry pool
        assert s["policy"] in ("static", "continuous") and "KV pool exhausted" in result.error
        assert all(r.is_finished for r in requests)
        return
    for r in requests:
        assert r.finish_reason is FinishReason.LENGTH
        assert r.num_output_tokens == min(r.max_tokens, MAX_MODEL_LEN - r.num_prompt_tokens)
        assert len(r.token_times) == r.num_output_tokens
        assert r.token_times == sorted(r.token_times) and r.token_times[0] >= r.arrival_time


@settings(max_examples=30, deadline=None)
@given(scenarios())
def test_virtual_time_runs_are_bit_for_bit_reproducible(s):
    def run():
        engine, requests = build(s)
        result = engine.run(requests)
        return result.steps, [(r.token_times, r.finish_reason, r.num_preemptions) for r in requests]

    assert run() == run()


@st.composite
def sharing_scenarios(draw):
    """Prompts over three token ids in tiny blocks: chains share roots, part ways, meet again;
    small pools evict them piecemeal; both preemption modes re-admit requests."""
    s = draw(scenarios())
    vocab = st.integers(0, 2)
    s["specs"] = [(t, draw(st.lists(vocab, min_size=1, max_size=30)), o) for t, _, o in s["specs"]]
    s.update(allocator="paged", block_size=draw(st.sampled_from([1, 2, 4])),
             policy=draw(st.sampled_from(["continuous", "recompute", "swap"])))  # fmt: skip
    return s


def cache_trace(engine: Engine, trace: list) -> None:
    """What the prefix cache does, step by step, as anyone could observe it: which blocks
    are free in which eviction order, who holds what, evictions, hits."""
    alloc, sched = engine.allocator, engine.scheduler
    pool = alloc.pool
    tables = {r.request_id: list(alloc.block_table(r)) for r in sched.running}
    trace.append((pool.free_queue.blocks(), list(pool.ref_cnt), pool.num_evictions, tables, astuple(alloc.counters)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sharing_scenarios())
def test_deferred_hashing_caches_exactly_as_hashing_every_block(s):
    """Blocks of chains nobody else has shown are held unhashed (deferred_hashing): every step, the
    same free queue, tables, evictions and hits as an allocator that hashes every block; at
    the end, once the deferred chains are indexed, the same index."""
    runs = []
    for defer in (True, False):
        engine, requests = build(s)
        engine.allocator.defer_unshared = defer
        trace: list = []
        result = engine.run(requests, on_step=lambda now, finished, e=engine, t=trace: cache_trace(e, t))
        assert result.error is None or "KV pool exhausted" in result.error
        runs.append((engine, trace, result.steps, [(r.token_times, r.num_cached_tokens) for r in requests]))
    (lazy, *lazy_rest), (eager, *eager_rest) = runs
    assert lazy_rest == eager_rest
    # afterwards every chain is found as eagerly indexed blocks would be (a lookup of a root
    # with a deferred chain indexes it first), and then the indexes are the same
    for spec in s["specs"]:
        probe = Request("probe", 0.0, list(spec[1]) + [0] * s["block_size"], 1)
        assert lazy.allocator.cached_prefix_tokens(probe) == eager.allocator.cached_prefix_tokens(probe)
    assert lazy.allocator.pool.cached == eager.allocator.pool.cached
    assert lazy.allocator.pool.roots == eager.allocator.pool.roots
