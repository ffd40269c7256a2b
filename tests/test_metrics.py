"""Summary figures, checked against hand-computed values."""

from __future__ import annotations

import pytest

from paged_bench.allocators.base import KVLayout
from paged_bench.engine import STEP_COLUMNS, EngineResult, StepRecords
from paged_bench.metrics import LATENCIES, PERCENTILES, request_latency, summarize
from paged_bench.request import FinishReason, Request


def finished(rid, arrival, scheduled, times, prompt=4, reason=FinishReason.LENGTH) -> Request:
    r = Request(rid, arrival, list(range(prompt)), len(times))
    r.first_scheduled_time = scheduled
    r.token_ids += [0] * len(times)
    r.token_times = list(times)
    r.finish(reason, times[-1] if times else scheduled)
    return r


def step(t, dt, live, reserved):
    row = dict.fromkeys(STEP_COLUMNS, 0)
    row.update(time=t, duration=dt, kv_live_slots=live, kv_reserved_slots=reserved)
    return tuple(row[c] for c in STEP_COLUMNS)


def result(requests, steps=(), duration=2.0, **kw) -> EngineResult:
    base = dict(layout=KVLayout(10, 16, 0), kv_bytes_per_token=None, num_preemptions=0, recomputed_tokens=0,
                swapped_blocks=0, prefix_query_tokens=0, prefix_hit_tokens=0)
    records = StepRecords()
    for row in steps:
        records.append(row)
    return EngineResult(list(requests), records, duration, **{**base, **kw})


def test_per_request_latencies():
    lat = request_latency(finished(0, 1.0, 1.1, [1.3, 1.4, 1.6]))
    assert lat.ttft_ms == pytest.approx(300)
    assert lat.e2el_ms == pytest.approx(600)
    assert lat.tpot_ms == pytest.approx(150)  # (600 - 300) / 2
    assert lat.queue_ms == pytest.approx(100)
    assert lat.itl_ms == pytest.approx([100, 200])


def test_summary_over_completed_requests_only():
    a = finished(0, 0.0, 0.0, [0.1, 0.2, 0.3])  # ttft 100, e2el 300, tpot 100
    b = finished(1, 0.5, 0.6, [0.8, 1.2])  # ttft 300, e2el 700, tpot 400
    failed = finished(2, 0.0, None, [], reason=FinishReason.ERROR)
    s = summarize(result([a, b, failed], duration=2.0))
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["total_output_tokens"] == 5 and s["total_input_tokens"] == 8
    assert s["output_throughput"] == pytest.approx(2.5)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["total_token_throughput"] == pytest.approx(6.5)
    assert s["mean_ttft_ms"] == pytest.approx(200) and s["median_ttft_ms"] == pytest.approx(200)
    assert s["p99_e2el_ms"] == pytest.approx(300 + 0.99 * 400)
    assert s["mean_tpot_ms"] == pytest.approx(250)
    assert s["mean_itl_ms"] == pytest.approx((100 + 100 + 400) / 3)
    assert s["mean_queue_ms"] == pytest.approx(50)
    assert "goodput" not in s


def test_goodput_counts_requests_meeting_every_slo():
    a = finished(0, 0.0, 0.0, [0.1, 0.2, 0.3])
    b = finished(1, 0.5, 0.6, [0.8, 1.2])
    s = summarize(result([a, b], duration=2.0), {"ttft_ms": 200, "tpot_ms": None, "e2el_ms": 1000})
    assert s["goodput"] == pytest.approx(0.5)  # only a meets TTFT <= 200 ms


def test_kv_figures_from_the_steps():
    steps = [step(0.1, 0.1, 10, 32), step(0.4, 0.3, 30, 32), step(0.5, 0.1, 0, 0)]
    s = summarize(result([], steps))
    assert s["kv_live_slots_peak"] == 30 and s["kv_reserved_slots_peak"] == 32
    assert s["kv_waste_pct"] == pytest.approx(100 * (1 - 30 / 32))
    assert s["kv_utilization_mean"] == pytest.approx((0.1 * 10 / 32 + 0.3 * 30 / 32) / 0.4)
    assert "kv_bytes_per_token" not in s
    s = summarize(result([], steps, kv_bytes_per_token=1024))
    assert s["kv_reserved_bytes_peak"] == 32 * 1024


def test_counters_and_hit_rate_pass_through():
    s = summarize(result([], num_preemptions=3, recomputed_tokens=40, swapped_blocks=5,
                         prefix_query_tokens=200, prefix_hit_tokens=50))
    assert (s["num_preemptions"], s["recomputed_tokens"], s["swapped_blocks"]) == (3, 40, 5)
    assert s["prefix_cache_hit_rate"] == 0.25


def test_every_key_is_present_even_without_samples():
    s = summarize(result([], duration=0.0))
    for name in LATENCIES:
        for label in PERCENTILES:
            assert s[f"{label}_{name}_ms"] is None
    assert s["output_throughput"] == 0.0 and s["kv_waste_pct"] is None
