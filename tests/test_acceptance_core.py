"""The engine-core issue's "done when", on the simulated backend: the seeds' shapes."""

from __future__ import annotations

import pytest

from paged_bench.results.metrics import summarize
from paged_bench.run.bench import build


def run(config, *overrides):
    bench = build(config("backend=sim", "workload=seed", *overrides))
    result = bench.engine.run(bench.requests)
    return result, summarize(result)


def ttft_ratio(config, max_batch):
    _, static = run(config, "scheduler=static", f"max_batch={max_batch}")
    _, cont = run(config, "scheduler=continuous", f"max_batch={max_batch}")
    return static["median_ttft_ms"] / cont["median_ttft_ms"]


def test_continuous_cuts_median_ttft_at_least_3x_and_more_at_32(config):
    at16, at32 = ttft_ratio(config, 16), ttft_ratio(config, 32)
    assert at16 >= 3
    assert at32 > at16


def test_throughput_rises_with_max_batch_for_both_policies(config):
    for policy in ("static", "continuous"):
        tput = [run(config, f"scheduler={policy}", f"max_batch={b}")[1]["output_throughput"] for b in (2, 8, 32)]
        assert tput == sorted(tput) and tput[-1] > tput[0]


def test_paging_cuts_kv_reservation_at_least_3x(config):
    _, contiguous = run(config, "allocator=contiguous", "max_model_len=512")
    _, paged = run(config, "allocator=paged", "block_size=16")
    assert contiguous["kv_reserved_slots_peak"] >= 3 * paged["kv_reserved_slots_peak"]
    assert contiguous["kv_live_slots_peak"] == paged["kv_live_slots_peak"]  # same tokens, other reservation


def test_block_size_one_reserves_exactly_what_is_live(config):
    result, s = run(config, "block_size=1")
    assert all(row.kv_live_slots == row.kv_reserved_slots for row in result.steps)
    assert s["kv_waste_pct"] == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_overload_with_a_small_pool_preemptive_finishes_everything(config, mode):
    result, s = run(config, "workload.rate=100", "num_blocks=64", "max_batch=32", "scheduler=preemptive",
                    f"scheduler.mode={mode}")
    assert result.error is None and s["completed"] == 48 and s["failed"] == 0
    assert s["num_preemptions"] > 0 and result.leaks == []


def test_overload_with_a_small_pool_continuous_stops_with_the_clear_error(config):
    result, s = run(config, "workload.rate=100", "num_blocks=64", "max_batch=32", "scheduler=continuous")
    assert "KV pool exhausted" in result.error and "num_blocks" in result.error
    assert s["failed"] > 0 and result.steps and result.leaks == []
