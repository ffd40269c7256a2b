"""The SJF scheduler on paged_bench's engine (sim backend, virtual time): admission order,
aging, options, and that it serves every request and returns every block."""

from __future__ import annotations

import numpy as np
import pytest
from paged_bench_sjf.scheduler import SJFScheduler

from paged_bench.core.clock import make_clock
from paged_bench.core.engine import Engine
from paged_bench.core.request import Request
from paged_bench.errors import ConfigError
from paged_bench.run import registry
from paged_bench.workloads.base import WorkloadContext

MAX_MODEL_LEN = 512


def make_engine(scheduler_cls=SJFScheduler, *, max_batch: int, num_blocks: int = 512, **options) -> Engine:
    backend = registry.create("backend", "sim")
    allocator = registry.create("allocator", "paged", num_blocks=num_blocks, block_size=16)
    backend.bind(allocator)
    scheduler = scheduler_cls(
        allocator, max_model_len=MAX_MODEL_LEN, max_batch=max_batch, max_num_batched_tokens=8192,
        eos_token_id=backend.eos_token_id, **options,
    )  # fmt: skip
    return Engine(scheduler, backend, make_clock("virtual"))


def requests(max_tokens: list[int], arrival: float = 0.0) -> list[Request]:
    return [Request(i, arrival, list(range(1, 33)), n) for i, n in enumerate(max_tokens)]


def seed_workload(num_requests: int = 48) -> list[Request]:
    workload = registry.create(
        "workload", "poisson", num_requests=num_requests, rate=25.0,
        prompt_len={"dist": "uniform", "low": 32, "high": 128},
        output_len={"dist": "heavy_tail", "short": 24, "long": 150, "long_fraction": 0.2, "spread": 0.25}, seed=0,
    )  # fmt: skip
    return workload.requests(WorkloadContext(32000, lambda text: [1] * len(text)))


def test_admits_the_shortest_predicted_output_first():
    reqs = requests([50, 5, 20, 80])
    result = make_engine(max_batch=1).run(reqs)
    order = sorted(result.requests, key=lambda r: r.first_scheduled_time)
    assert [r.max_tokens for r in order] == [5, 20, 50, 80]


def test_fcfs_would_admit_in_arrival_order():
    """The control: the built-in continuous scheduler on the same requests."""
    reqs = requests([50, 5, 20, 80])
    result = make_engine(registry.load("scheduler", "continuous"), max_batch=1).run(reqs)
    assert [r.max_tokens for r in sorted(result.requests, key=lambda r: r.first_scheduled_time)] == [50, 5, 20, 80]


def test_every_request_finishes_and_no_block_leaks():
    engine = make_engine(max_batch=8, num_blocks=8 * MAX_MODEL_LEN // 16)  # room for 8 full-length sequences
    result = engine.run(seed_workload())
    assert result.error is None and not result.leaks
    assert all(r.finish_reason is not None and r.finish_reason.succeeded for r in result.requests)
    assert [r.num_output_tokens for r in result.requests] == [r.max_tokens for r in result.requests]


def test_lower_median_ttft_than_fcfs_on_the_heavy_tail():
    def median_ttft(cls) -> float:
        result = make_engine(cls, max_batch=4).run(seed_workload())
        return float(np.median([r.token_times[0] - r.arrival_time for r in result.requests]))

    assert median_ttft(SJFScheduler) < median_ttft(registry.load("scheduler", "continuous"))


def test_max_wait_lets_an_old_long_request_go_first():
    blocker = Request("blocker", 0.0, list(range(1, 33)), 60)  # the shortest at t=0: holds the only seat
    long_old = Request("old", 0.0, list(range(1, 33)), 100)
    short_new = Request("new", 0.05, list(range(1, 33)), 2)  # arrives while the blocker runs (>= 60 steps of 3 ms)
    for max_wait, first in ((None, "new"), (0.1, "old")):
        reqs = [
            Request(r.request_id, r.arrival_time, list(r.token_ids), r.max_tokens)
            for r in (blocker, long_old, short_new)
        ]
        result = make_engine(max_batch=1, max_wait_s=max_wait).run(reqs)
        after_blocker = sorted(
            (r for r in result.requests if r.request_id != "blocker"), key=lambda r: r.first_scheduled_time
        )
        assert after_blocker[0].request_id == first, max_wait


def test_noise_makes_the_prediction_imperfect_but_reproducible():
    a, b = make_engine(max_batch=1, noise=0.5, seed=3), make_engine(max_batch=1, noise=0.5, seed=3)
    reqs = requests([10] * 20)
    got_a = [a.scheduler.predicted_output(r) for r in reqs]
    assert got_a == [b.scheduler.predicted_output(r) for r in reqs]
    assert len(set(got_a)) == len(reqs)  # not all equal to max_tokens any more


@pytest.mark.parametrize("bad", [{"noise": -1.0}, {"max_wait_s": 0}, {"max_wait_s": "soon"}])
def test_bad_options_name_their_key(bad):
    with pytest.raises(ConfigError) as e:
        make_engine(max_batch=1, **bad)
    assert f"scheduler.{next(iter(bad))}" in str(e.value)
