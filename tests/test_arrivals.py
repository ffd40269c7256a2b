"""Open and closed loops (``workload.max_concurrency``): the same cap for in-process and HTTP runs."""

from __future__ import annotations

import pytest

from paged_bench.core.arrivals import ClosedLoop, OpenLoop
from paged_bench.core.request import Request
from paged_bench.run.job import run_job
from paged_bench.serve import serve_in_thread
from tests.test_serve_api import FAST, all_free, wait_for

BURST = ("workload=uniform", "workload.num_requests=40", "workload.rate=inf", "workload.prompt_len=32",
         "workload.output_len=8")  # fmt: skip


def reqs(*arrivals: float) -> list[Request]:
    return [Request(i, t, [1, 2, 3], 2) for i, t in enumerate(arrivals)]


def most_in_flight(requests) -> int:
    """Most requests between sending and their end at any instant (an end frees before a send)."""
    events = sorted([(r.arrival_time, 1) for r in requests] + [(r.finish_time, -1) for r in requests])
    peak = level = 0
    for _, change in events:
        level += change
        peak = max(peak, level)
    return peak


def test_open_loop_sends_each_request_at_its_arrival_time():
    loop = OpenLoop(reqs(0.5, 0.0, 2.0))
    assert [r.request_id for r in loop.due(0.0)] == [1]
    assert loop.next_time() == 0.5 and loop.due(0.4) == []
    assert [r.request_id for r in loop.due(3.0)] == [0, 2]
    assert loop.next_time() is None and loop.pending() == []


def test_closed_loop_waits_for_a_free_slot_and_starts_the_clock_when_it_sends():
    loop = ClosedLoop(reqs(0.0, 0.0, 0.0, 5.0), max_concurrency=2)
    first = loop.due(0.0)
    assert [r.request_id for r in first] == [0, 1] and loop.due(1.0) == []
    assert loop.next_time() is None  # only a finish frees a slot
    loop.finished(first[:1], 1.5)
    third = loop.due(1.5)
    assert [r.request_id for r in third] == [2] and third[0].arrival_time == 1.5
    loop.finished(first[1:] + third, 2.0)
    assert loop.next_time() == 5.0 and loop.due(4.0) == []  # a free slot still waits for the arrival
    assert [r.request_id for r in loop.due(5.0)] == [3]


def test_engine_never_runs_more_than_max_concurrency(config, tmp_path):
    out = run_job(config(*BURST, "workload.max_concurrency=8", "tracking.enabled=false"), tmp_path / "closed")
    assert out.summary["completed"] == 40
    assert out.result.steps.column("running").max() == 8
    assert most_in_flight(out.result.requests) == 8
    open_loop = run_job(config(*BURST, "tracking.enabled=false"), tmp_path / "open")
    assert open_loop.result.steps.column("running").max() == 16  # max_batch: the cap is what held it to 8


def test_one_user_at_a_time_waits_for_no_one(config, tmp_path):
    out = run_job(config(*BURST, "workload.max_concurrency=1", "tracking.enabled=false"), tmp_path)
    ttfts = {round(r.first_token_time - r.arrival_time, 9) for r in out.result.requests}
    assert len(ttfts) == 1  # each request's clock starts when it is sent: no queueing behind the others
    assert most_in_flight(out.result.requests) == 1


@pytest.fixture(scope="module")
def server():
    handle = serve_in_thread("server.port=0", "server.log_level=warning", "scheduler=continuous", *FAST)
    yield handle
    handle.stop()


def test_http_runs_keep_the_same_cap(server, config, tmp_path, monkeypatch):
    from paged_bench.loadgen import runner

    sending = {"now": 0, "most": 0}
    real_send = runner.send

    async def counting_send(*args, **kwargs):  # requests on the wire, counted at the client
        sending["now"] += 1
        sending["most"] = max(sending["most"], sending["now"])
        try:
            return await real_send(*args, **kwargs)
        finally:
            sending["now"] -= 1

    monkeypatch.setattr(runner, "send", counting_send)
    remote = ("target=openai", f"target.base_url={server.url}/v1", "target.warmup=0")
    burst = (*BURST[:2], "workload.num_requests=12", *BURST[2:])
    out = run_job(config(*burst, *FAST, *remote, "workload.max_concurrency=3"), tmp_path / "closed")
    assert out.summary["completed"] == 12
    assert sending["most"] == 3
    wait_for(lambda: all_free(server))
    sending["most"] = 0
    run_job(config(*burst, *FAST, *remote), tmp_path / "open")
    assert sending["most"] > 3  # without the cap, the burst goes out at once
    wait_for(lambda: all_free(server))
