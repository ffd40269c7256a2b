"""The load generator measures as vLLM's benchmark client does (``calculate_metrics`` in
``vllm/benchmarks/serve.py``, the request functions in ``vllm/benchmarks/lib/endpoint_request_func.py``),
against a real HTTP server whose timing is known: tests/fake_openai_server.py bundles 3 tokens
per chunk, sends its usage chunk and ``[DONE]`` late, answers one request without usage and
fails the last one slowly. Its log (when each request came, each content chunk left, each
response ended) is the truth the figures are checked against, within a few ms of clock jitter:

- E2EL ends at the last chunk carrying content, not at the usage chunk or ``[DONE]``;
- TPOT = (E2EL - TTFT) / (output tokens - 1), output tokens from ``usage`` (else the
  tokenizer's count of the text), not the number of chunks;
- the duration lasts until every request has returned, the failed one included;
- on vLLM's schedule (``target=openai``'s default) the server receives the first request one
  gap after the start and the last at N / rate.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from paged_bench.loadgen.spawn import free_port
from paged_bench.results.records import text_digest
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job
from paged_bench.workloads.schedule import vllm_arrivals
from tests import fake_openai_server as fake

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 9  # 3 chunks of 3
WORKLOAD = ("workload=uniform", "workload.num_requests=4", "workload.rate=inf", "workload.prompt_len.low=8",
            "workload.prompt_len.high=9", f"workload.output_len.value={TOKENS}")  # fmt: skip
# the server's clock against the client's: within 1 ms on a quiet machine, a few ms when other
# processes hold both cores (4.3 ms once, under make test's two workers on a clean clone); the
# definitional gaps checked here are 220 ms (the stream's tail) and 8x (TPOT per chunk instead
# of per token), far beyond it
TOLERANCE_MS = 10.0


@pytest.fixture(scope="module")
def fake_server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fake_openai_server", str(port)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v1/models", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail("the fake server did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def measured(fake_server, tmp_path_factory):
    """One run: warm-up, then the 4 requests one at a time (concurrency 1, all due at t=0)."""
    run_dir = tmp_path_factory.mktemp("run")
    # the fake server speaks bytes: a client's vocabulary of bytes counts its text as it does
    cfg = compose_config(*WORKLOAD, "target=openai", f"target.base_url={fake_server}/v1", "target.warmup=1",
                         "target.concurrency=1", "backend.vocab_size=258")  # fmt: skip
    outcome = run_job(cfg, run_dir)
    log = httpx.get(f"{fake_server}/log").json()
    with (run_dir / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    return outcome, log[1:], rows  # log[0] is the warm-up


def test_the_server_log_is_the_expected_shape(measured):
    _, log, rows = measured
    assert [e["index"] for e in log] == [1, 2, 3, 4] and len(rows) == 4
    assert all(len(e["writes"]) == 3 for e in log[:3]) and log[3]["writes"] == []


def _send_to_handler_ms(entry: dict, row: dict) -> float:
    """The client's TTFT minus the server's: sending and parsing the request, not the stream."""
    return float(row["ttft_ms"]) - (entry["writes"][0] - entry["received"]) * 1e3


def test_e2el_ends_at_the_last_content_chunk(measured):
    _, log, rows = measured
    for entry, row in zip(log[:3], rows[:3]):
        lead = _send_to_handler_ms(entry, row)
        assert 0 <= lead < 50  # the stream's tail (usage + [DONE], 220 ms) is not in it
        expected = (entry["writes"][-1] - entry["received"]) * 1e3 + lead
        assert float(row["e2el_ms"]) == pytest.approx(expected, abs=TOLERANCE_MS)
        # the stream's end, 220 ms after the last content, is kept as the finish time
        stream_ms = (float(row["finish_time"]) - float(row["arrival_time"])) * 1e3
        assert stream_ms >= float(row["e2el_ms"]) + (fake.USAGE_S + fake.DONE_S) * 1e3 - TOLERANCE_MS


def test_tpot_divides_by_output_tokens_not_chunks(measured):
    outcome, log, rows = measured
    expected = [(e["writes"][-1] - e["writes"][0]) * 1e3 / (TOKENS - 1) for e in log[:3]]  # 12.5 ms nominal
    assert [float(r["tpot_ms"]) for r in rows[:3]] == pytest.approx(expected, abs=TOLERANCE_MS)
    assert outcome.summary["mean_tpot_ms"] == pytest.approx(np.mean(expected), abs=TOLERANCE_MS)
    gaps = [(b - a) * 1e3 for e in log[:3] for a, b in zip(e["writes"], e["writes"][1:])]
    assert outcome.summary["mean_itl_ms"] == pytest.approx(np.mean(gaps), abs=TOLERANCE_MS)  # ITL is per chunk
    # the request answered without usage: its tokens are the tokenizer's count of the text
    assert [int(r["output_tokens"]) for r in rows] == [TOKENS, TOKENS, TOKENS, 0]
    assert outcome.summary["total_output_tokens"] == 3 * TOKENS


def test_duration_lasts_until_every_request_returned(measured):
    outcome, log, rows = measured
    finished = [float(r["finish_time"]) for r in rows]
    # the failed request returned last, after the server had held it FAIL_S
    assert max(finished) == finished[3] and log[3]["end"] - log[3]["received"] >= fake.FAIL_S - 0.002
    # vLLM's benchmark_duration: until asyncio.gather has every request back, failed ones included
    assert 0 <= outcome.summary["duration"] - finished[3] < TOLERANCE_MS * 1e-3
    s = outcome.summary
    assert (s["completed"], s["failed"]) == (3, 1)
    assert s["request_throughput"] == pytest.approx(3 / s["duration"])
    assert s["output_throughput"] == pytest.approx(3 * TOKENS / s["duration"])
    assert s["max_concurrent_requests"] == 1  # one at a time


def test_rows_carry_the_outcome_and_the_text_digest(measured):
    _, _, rows = measured
    assert [r["finish_reason"] for r in rows] == ["length"] * 3 + ["error"]
    assert rows[3]["error"].startswith("HTTP 500: injected failure")
    assert {r["text_digest"] for r in rows[:3]} == {text_digest("x" * TOKENS)}
    assert all(r["output_digest"] == "" and r["cached_tokens"] == "" for r in rows)  # unknown to a client


def test_vllms_schedule_is_what_the_server_sees(fake_server, tmp_path):
    """target=openai sends on vLLM's schedule by default (workload.schedule=auto): the first
    request one gap after the start, the last at N / rate (tests/test_vllm_schedule.py checks
    the times themselves against vLLM's get_request), as sent and as the server received them."""
    n, rate = 8, 20.0
    planned = vllm_arrivals(n, rate, 1.0, 4, lambda k: np.zeros(k))
    before = len(httpx.get(f"{fake_server}/log").json())
    cfg = compose_config("workload=poisson", f"workload.num_requests={n}", f"workload.rate={rate}", "seed=4",
                         "workload.prompt_len.low=8", "workload.prompt_len.high=9", "workload.output_len.max=3",
                         "target=openai", f"target.base_url={fake_server}/v1", "target.warmup=0",
                         "backend.vocab_size=258")  # fmt: skip
    run_job(cfg, tmp_path)
    log = httpx.get(f"{fake_server}/log").json()[before:]
    with (tmp_path / "requests.csv").open() as f:
        sent = sorted(float(r["arrival_time"]) for r in csv.DictReader(f))
    assert planned[0] > 0.005 and planned[-1] == pytest.approx(n / rate)
    # a busy machine only sends late, never early: none before its time, most within the tolerance
    # (one send 19 ms late was seen at load average 6), none by more than a few times it
    late = np.array(sent) - planned
    assert late.min() >= -1e-3 and np.median(late) <= TOLERANCE_MS * 1e-3 and late.max() <= 5 * TOLERANCE_MS * 1e-3
    received = sorted(e["received"] for e in log)
    assert len(received) == n
    # a busy machine only delays a request's arrival at the server, so the spread is bounded from
    # below: requests sent at once (the old schedule's burst, or no schedule) would fail it. The
    # first may be delayed more than the last (its connection is the first opened: one run saw the
    # spread 0.04 ms short of a 10 ms bound), by as much as a send may be late
    assert received[-1] - received[0] >= planned[-1] - planned[0] - 5 * TOLERANCE_MS * 1e-3
