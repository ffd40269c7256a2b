"""The engine's own cost: scheduling + allocation + bookkeeping per decode step, no model.

Run with ``make bench`` (pytest-benchmark). For scale, on this kind of machine nano-vllm's
pure-Python scheduler and block manager cost about 0.6 us per running sequence per step,
and the Vidur simulator runs about 4,000 engine steps per second; each benchmark's
``extra_info`` holds our per-sequence cost or steps per second from the same run.
"""

from __future__ import annotations

import pytest

from paged_bench.allocators.paged import PagedAllocator
from paged_bench.backends.sim import SimBackend
from paged_bench.build import build
from paged_bench.clock import VirtualClock
from paged_bench.engine import Engine
from paged_bench.request import Request
from paged_bench.schedulers.continuous import ContinuousScheduler
from paged_bench.step import StepOutput
from tests.conftest import compose_config


def decoding_engine(num_seqs: int, block_size: int = 16) -> Engine:
    """An engine with ``num_seqs`` requests past their prefill, decoding for ever."""
    alloc = PagedAllocator(num_blocks=num_seqs * 512, block_size=block_size)
    sched = ContinuousScheduler(alloc, max_model_len=1 << 20, max_batch=num_seqs, max_num_batched_tokens=1 << 30)
    for i in range(num_seqs):
        sched.add_request(Request(i, 0.0, list(range(i * 64, i * 64 + 64)), 1 << 20), 0.0)
    backend = SimBackend()
    backend.bind(alloc)
    engine = Engine(sched, backend, VirtualClock())
    engine.step()  # the prefill
    return engine


@pytest.mark.parametrize("num_seqs", [32, 256, 1024])
def test_scheduler_overhead_per_decode_step(benchmark, num_seqs):
    """schedule + allocate + update for one decode step: the per-step cost of the engine core."""
    sched = decoding_engine(num_seqs).scheduler
    tokens = StepOutput([0] * num_seqs)

    def one_step():
        plan = sched.schedule(0.0)
        sched.update(plan, tokens, 0.0)

    benchmark.pedantic(one_step, rounds=50 if num_seqs == 1024 else 200, iterations=5, warmup_rounds=5)
    if benchmark.stats:
        benchmark.extra_info["us_per_seq"] = benchmark.stats["median"] * 1e6 / num_seqs
    assert len(sched.running) == num_seqs


def test_sim_engine_steps_per_second_at_32_sequences(benchmark):
    """A whole engine step with the sim backend: schedule, cost model, update, step record."""
    engine = decoding_engine(32)
    benchmark.pedantic(engine.step, rounds=200, iterations=20, warmup_rounds=5)
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
