"""The engine's own cost: scheduling + allocation + bookkeeping per decode step, no model.

Run with ``make bench`` (pytest-benchmark). The core benchmark is nano-vllm's own loop:
``num_seqs`` sequences decoding fake tokens, prefix caching on, each round one whole block
(``block_size`` steps), so the step where every sequence takes a new block and hashes a full
one is counted at its real frequency. Its ``extra_info`` holds our microseconds per
sequence-step and their ratio to nano-vllm's pure-Python scheduler + block manager on this
machine (0.59-0.75 us per sequence-step at block size 256, measured outside the project:
nano-vllm is not on PyPI, and its code is not copied here). The Vidur simulator runs about
4,000 engine steps per second; the steps-per-second benchmarks print ours.
"""

from __future__ import annotations

import pytest

from paged_bench.backends.sim import SimBackend
from paged_bench.core.clock import VirtualClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.block_pool import BlockPool
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import StepOutput
from paged_bench.core.request import Request
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from paged_bench.run.bench import build
from tests.conftest import compose_config

NANO_VLLM_US_PER_SEQ_STEP = (0.59, 0.75)  # block size 256, this machine, outside the project


def decoding_engine(
    num_seqs: int, block_size: int = 16, max_decode_steps: int = 4096, defer_unshared: bool = True
) -> Engine:
    """An engine with ``num_seqs`` requests past their prefill, decoding (up to
    ``max_decode_steps`` steps: what the pool holds)."""
    blocks_per_seq = (64 + max_decode_steps) // block_size + 2
    alloc = PagedAllocator(
        num_blocks=num_seqs * blocks_per_seq, block_size=block_size, defer_unshared=defer_unshared
    )
    sched = ContinuousScheduler(alloc, max_model_len=1 << 20, max_batch=num_seqs, max_num_batched_tokens=1 << 30)
    for i in range(num_seqs):
        sched.add_request(Request(i, 0.0, list(range(i * 64, i * 64 + 64)), 1 << 20), 0.0)
    backend = SimBackend()
    backend.bind(alloc)
    engine = Engine(sched, backend, VirtualClock())
    engine.step()  # the prefill
    return engine


@pytest.mark.parametrize("hashing", ["deferred", "every_block"])
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("num_seqs", [32, 256, 1024])
def test_scheduler_overhead_per_decode_sequence_step(benchmark, num_seqs, block_size, hashing):
    """schedule + allocate + update, one whole block of decode steps per round. ``every_block``
    hashes each full block as nano-vllm does (the like-for-like comparison); ``deferred``
    (the default) hashes only blocks another chain could hit: here none past each root."""
    rounds = (4 if num_seqs == 1024 else 16) * (16 if block_size == 16 else 1)  # about 4k (1k) steps
    defer = hashing == "deferred"
    sched = decoding_engine(num_seqs, block_size, (rounds + 1) * block_size, defer).scheduler
    tokens = StepOutput([0] * num_seqs)

    def one_block_of_steps():
        for _ in range(block_size):
            plan = sched.schedule(0.0)
            sched.update(plan, tokens, 0.0)

    benchmark.pedantic(one_block_of_steps, rounds=rounds, iterations=1, warmup_rounds=1)
    if benchmark.stats:
        us = benchmark.stats["median"] * 1e6 / (num_seqs * block_size)
        benchmark.extra_info["us_per_seq_step"] = round(us, 4)
        lo, hi = NANO_VLLM_US_PER_SEQ_STEP
        benchmark.extra_info["ratio_to_nano_vllm"] = f"{us / hi:.2f}-{us / lo:.2f}"
    assert len(sched.running) == num_seqs


def test_sim_engine_steps_per_second_at_32_sequences(benchmark):
    """A whole engine step with the sim backend: schedule, cost model, update, step record."""
    engine = decoding_engine(32)
    benchmark.pedantic(engine.step, rounds=100, iterations=16, warmup_rounds=1)
    if benchmark.stats:
        benchmark.extra_info["steps_per_s"] = 1 / benchmark.stats["median"]


def test_whole_sim_run_of_the_seed_workload(benchmark):
    """``python -m paged_bench backend=sim`` minus start-up: build, run 48 requests, done."""
    cfg = compose_config("backend=sim", "workload=seed")

    def run():
        bench = build(cfg)
        return bench.engine.run(bench.requests)

    result = benchmark.pedantic(run, rounds=10, iterations=1, warmup_rounds=1)
    if benchmark.stats:
        benchmark.extra_info["steps_per_s"] = len(result.steps) / benchmark.stats["median"]
    assert result.error is None and len(result.steps) > 100


def test_making_a_pool_sized_from_a_large_gpu(benchmark):
    """A pool of 646,000 blocks (Llama-3-8B on 8 x B200 with ``num_blocks=auto``, tp_tradeoff's
    largest): a block's free-queue node is made only when the block first leaves the queue."""
    pool = benchmark(BlockPool, 646_000)
    assert pool.num_free == 646_000 and pool.get_new_blocks(2) == [0, 1]
