"""Summary figures, checked against hand-computed values."""

from __future__ import annotations

import csv
import hashlib
import math
import struct
from array import array

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from paged_bench.core.engine import STEP_COLUMNS, EngineResult, StepRecords
from paged_bench.core.kv.base import KVLayout
from paged_bench.core.request import FinishReason, Request
from paged_bench.results import run_files as outputs
from paged_bench.results.metrics import (
    LATENCIES,
    PERCENTILES,
    peak_concurrency,
    request_figures,
    request_latency,
    summarize,
)
from paged_bench.results.records import RequestOutput, RequestRecords, text_digest, token_digest
from paged_bench.results.run_files import REQUEST_COLUMNS, _write_csv, request_columns, request_rows


def finished(rid, arrival, scheduled, times, prompt=4, reason=FinishReason.LENGTH) -> Request:
    r = Request(rid, arrival, list(range(prompt)), len(times))
    r.first_scheduled_time = scheduled
    r.token_ids.extend([0] * len(times))
    r.token_times = list(times)
    r.finish(reason, times[-1] if times else scheduled if scheduled is not None else arrival)
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


def test_std_is_the_population_std_as_numpy_and_vllm_compute_it():
    a = finished(0, 0.0, 0.0, [0.1, 0.2, 0.3])
    b = finished(1, 0.5, 0.6, [0.8, 1.2])
    s = summarize(result([a, b], duration=2.0))
    assert s["std_ttft_ms"] == pytest.approx(100)  # TTFTs 100 and 300
    assert s["std_itl_ms"] == pytest.approx(np.std([100, 100, 400]))
    assert s["std_e2el_ms"] == pytest.approx(200)  # 300 and 700
    assert summarize(result([], duration=0.0))["std_tpot_ms"] is None


def test_a_failed_request_ends_its_latencies_at_its_last_token():
    r = finished(0, 1.0, 1.0, [1.1, 1.3], reason=FinishReason.ERROR)
    r.finish_time = 5.0  # aborted long after its last token
    lat = request_latency(r)
    assert lat.e2el_ms == pytest.approx(300) and lat.tpot_ms == pytest.approx(200)


def test_tpot_divides_by_output_tokens_not_chunks():
    # 9 tokens in 3 chunks, 100 ms apart: vLLM's TPOT is 200 ms / 8 = 25 ms
    out = RequestOutput(0, 0.0, 9, 4, 9, [0.05, 0.15, 0.25], finish_time=0.6, finish_reason="length")
    s = request_figures(RequestRecords.from_outputs([out]), 1.0)
    assert s["mean_tpot_ms"] == pytest.approx(25)
    assert s["mean_e2el_ms"] == pytest.approx(250)  # the last chunk, not the stream's end at 600 ms
    assert s["mean_itl_ms"] == pytest.approx(100)  # chunk to chunk
    assert s["total_output_tokens"] == 9 and s["mean_queue_ms"] is None  # queueing is the server's secret


def vllm_peaks(starts, ttfts, itls, latencies) -> tuple[float, int]:
    """``max_output_tokens_per_s`` and ``max_concurrent_requests`` as calculate_metrics
    (vllm/benchmarks/serve.py) computes them over successful outputs, transcribed loop for loop."""
    min_start = min(starts)
    max_end = max(s + lat for s, lat in zip(starts, latencies))
    buckets = np.zeros(int(np.ceil(max_end - min_start)) + 1)
    for start, ttft, itl in zip(starts, ttfts, itls):
        times = [start + ttft]
        for gap in itl:
            times.append(times[-1] + gap)
        for t in times:
            b = int(t - min_start)
            if 0 <= b < len(buckets):
                buckets[b] += 1
    events = sorted([(s, 1) for s in starts] + [(s + lat, -1) for s, lat in zip(starts, latencies)])
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return float(buckets.max()), peak


def test_peaks_match_vllms_loops_on_random_runs():
    rng = np.random.default_rng(7)
    for _ in range(20):
        reqs = []
        for i in range(int(rng.integers(1, 60))):
            arrival = float(rng.uniform(0, 5))
            times = np.cumsum(rng.exponential(0.05, int(rng.integers(1, 40)))) + arrival + rng.uniform(0, 0.5)
            reqs.append(finished(i, arrival, arrival, times.tolist()))
        failed = finished(99, 0.0, 0.0, [0.1] * 50, reason=FinishReason.ERROR)  # never counted
        s = summarize(result([*reqs, failed], duration=10.0))
        starts = [r.arrival_time for r in reqs]
        ttfts = [r.token_times[0] - r.arrival_time for r in reqs]
        itls = [np.diff(r.token_times).tolist() for r in reqs]
        latencies = [r.token_times[-1] - r.arrival_time for r in reqs]
        tokens, concurrent = vllm_peaks(starts, ttfts, itls, latencies)
        assert (s["max_output_tokens_per_s"], s["max_concurrent_requests"]) == (tokens, concurrent)


def test_peaks_by_hand():
    a = finished(0, 0.5, 0.5, [0.6, 0.7, 1.4, 1.6])  # from 0.5: buckets 0, 0, 0, 1
    b = finished(1, 1.0, 1.0, [1.2, 1.55, 1.58])  # buckets 0, 1, 1
    c = finished(2, 1.58, 1.58, [2.0])  # starts as b ends: not concurrent with it
    s = summarize(result([a, b, c], duration=3.0))
    assert s["max_output_tokens_per_s"] == 4.0
    assert s["max_concurrent_requests"] == 2
    assert peak_concurrency(np.array([0.0, 1.0]), np.array([1.0, 2.0])) == 1  # half-open intervals
    assert summarize(result([], duration=0.0))["max_concurrent_requests"] == 0


def test_the_peak_over_a_run_of_a_trillion_seconds_needs_no_bucket_per_second():
    """A simulated run at a very low rate spans more virtual seconds than memory has bytes;
    the peak must count the buckets that hold chunks (this allocated 4 TiB and raised before)."""
    a = finished(0, 0.0, 0.0, [0.1, 0.2])
    b = finished(1, 1e12, 1e12, [1e12 + 0.3, 1e12 + 0.4, 1e12 + 0.5])
    c = finished(2, 1e301, 1e301, [1e301])  # beyond int64: the buckets stay floats
    s = summarize(result([a, b, c], duration=1e301))
    assert s["max_output_tokens_per_s"] == 3.0


def test_output_digest_is_blake2b_of_little_endian_int64_ids():
    a = finished(0, 0.0, 0.0, [0.1, 0.2])
    a.token_ids[-2:] = array("Q", [7, 300])
    expected = hashlib.blake2b(struct.pack("<2q", 7, 300), digest_size=8).hexdigest()
    records = RequestRecords.from_requests([a])
    assert records.output_digest == [expected] == [token_digest([7, 300])]
    assert token_digest([7, 301]) != expected and text_digest("ab") != text_digest("ba")


def _csv_text(value) -> str:
    return "" if math.isnan(value) else repr(value)  # nan: unknown


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True)))
def test_float_cells_are_their_repr(values):
    assert outputs.column_texts(np.array(values, dtype=float)) == list(map(_csv_text, values))


def test_float_cells_are_their_repr_over_every_magnitude():
    """orjson's digits stand in for repr's: at every exponent (raw bit patterns), near the
    edges where repr turns to an exponent, and at times and latencies as a run makes them."""
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 2**64, 100_000, dtype=np.uint64).view(np.float64)
    near = np.array([1e-4, 1e16, 0.0, -0.0, 5e-324, 1.7976931348623157e308])
    with np.errstate(over="ignore"):  # the largest float's next is inf: kept
        near = np.concatenate([near, np.nextafter(near, np.inf), np.nextafter(near, -np.inf)])
    scaled = rng.random(100_000) * 10.0 ** rng.integers(-6, 18, 100_000)
    for values in (raw, near, -near, scaled, np.cumsum(rng.random(10_000)) * 1e-3):
        assert outputs.column_texts(values) == list(map(_csv_text, values.tolist()))


def test_int_cells_are_their_repr_whatever_the_numerals_known():
    rng = np.random.default_rng(3)
    columns = [np.arange(5000), rng.integers(0, 70_000, 3000), rng.integers(-5, 5, 100), np.array([2**62, 0]),
               np.zeros(0, np.int64), rng.integers(0, 10, 2000)]  # fmt: skip
    for column in columns:
        assert outputs.column_texts(column) == list(map(repr, column.tolist()))
        assert outputs.column_texts(column.tolist()) == list(map(repr, column.tolist()))
    assert len(outputs._numerals) <= outputs._NUMERALS_MAX


TRICKY = ['plain', 'a, comma', 'a "quote"', 'two\nlines', 'cr\r', '', None, 'ünï']


# a column of text only is checked whole, at once: with a cell to quote among them, and without
@pytest.mark.parametrize("tricky", [TRICKY, [t for t in TRICKY if t is not None], ["plain", "ünï", ""]])
def test_csv_cells_are_what_csv_writer_writes(tmp_path, tricky):
    outs = [RequestOutput(f"id,{i}" if i % 2 else i, float(i), 4, 2, 0, finish_time=None if i % 3 else i + 0.5,
                          finish_reason="error", error=text) for i, text in enumerate(tricky)]  # fmt: skip
    records = RequestRecords.from_outputs(outs)
    ours = tmp_path / "ours.csv"
    _write_csv(ours, REQUEST_COLUMNS, request_rows(records))
    with (tmp_path / "csv.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(REQUEST_COLUMNS)
        raw = [c.tolist() if isinstance(c, np.ndarray) else c for c in request_columns(records)]
        writer.writerows(zip(*[[None if v != v else v for v in column] for column in raw]))  # nan: unknown
    assert ours.read_bytes() == (tmp_path / "csv.csv").read_bytes()
    with ours.open(newline="") as f:
        assert [r["error"] for r in csv.DictReader(f)] == [t or "" for t in tricky]
