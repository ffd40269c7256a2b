"""When outputs reach the client as vLLM 0.6.0's server hands them over
(``frontend.output_timing=vllm060``, paged_bench/run/output_timing.py), pinned with hand-derived
times on a linear simulator: a prompt step's first tokens come when the next step returns, a
multi-step window's tokens and the requests that end inside it at the window's end, earlier
where a request reaching the engine wakes its event loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from paged_bench.backends.sim import SimBackend
from paged_bench.core.clock import VirtualClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.request import Request
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job
from paged_bench.run.output_timing import deliver_as_vllm060
from tests.test_engine_behaviours import _refusal


def vllm_v0_engine() -> Engine:
    """vLLM 0.x's prompt steps first, one 4-token prompt a step, 4-step windows; priced by hand:
    3 ms a step (not on a window's later steps), 1 ms a decoding sequence, prompts free."""
    alloc = PagedAllocator(num_blocks=64, block_size=4, prefix_caching=False)
    sched = ContinuousScheduler(alloc, max_model_len=64, max_batch=8, max_num_batched_tokens=4, chunked_prefill=False,
                                prefill_first=True, num_scheduler_steps=4)  # fmt: skip
    backend = SimBackend(step_overhead_ms=3.0, per_prefill_token_ms=0.0, per_decode_seq_ms=1.0,
                         per_kv_token_us=0.0, per_swap_block_ms=0.0)  # fmt: skip
    backend.bind(alloc)
    return Engine(sched, backend, VirtualClock())


def run(reqs: list[Request], vllm060: bool) -> list[Request]:
    engine = vllm_v0_engine()
    window_log = engine.scheduler.window_log = [] if vllm060 else None
    result = engine.run(reqs)
    if window_log is not None:
        deliver_as_vllm060(result, window_log)
    assert result.leaks == [] and result.duration == max(r.finish_time for r in reqs)
    return reqs


def ms(times: list[float]) -> list[float]:
    return [round(t * 1e3, 6) for t in times]


@pytest.mark.parametrize(("vllm060", "a", "b"), [
    (False, [3, 11, 13], [6, 11]),  # each token at its step's end
    # A's first token is processed in B's prompt step and sent when it returns (6 ms); B's
    # first, in the window's first step, sent as it is launched (6 ms); the window's tokens, and
    # A and B, which ended inside it, when it is over (17 ms)
    (True, [6, 17, 17], [6, 17]),
])  # fmt: skip
def test_outputs_come_with_the_next_steps_return_and_a_windows_at_its_end(vllm060, a, b):
    """Steps: A's prompt 0-3 ms, B's 3-6, a window of 4: A and B decode 6-11 (B's last token),
    11-13 (A's last; B still computed, an idle row: 1 ms), then both idle 13-15 and 15-17, as
    vLLM runs a window to its last step."""
    ra, rb = run([Request("A", 0.0, [1, 2, 3, 4], 3), Request("B", 0.0, [5, 6, 7, 8], 2)], vllm060)
    assert ms(ra.token_times) == a and ms(rb.token_times) == b
    assert ms([ra.finish_time, rb.finish_time]) == [a[-1], b[-1]]


def test_a_request_reaching_the_engine_wakes_it_and_a_prompt_step_next_holds_the_window_back():
    """As above, and C (one output token) reaches the engine at 11.5 ms, inside the window: its
    arrival wakes the loop, so B's end, put there at 11 ms, goes at 11.5. A ends at 13 ms and
    its output, with its window's tokens, goes at the window's end (17 ms); C's prompt step
    runs 17-20 and its token goes when it returns, nothing running after it."""
    ra, rb, rc = run([Request("A", 0.0, [1, 2, 3, 4], 3), Request("B", 0.0, [5, 6, 7, 8], 2),
                      Request("C", 0.0115, [9, 10, 11, 12], 1)], vllm060=True)  # fmt: skip
    assert ms(ra.token_times) == [6, 17, 17] and ms(rb.token_times) == [6, 11.5] and ms(rc.token_times) == [20]
    assert ms([ra.finish_time, rb.finish_time, rc.finish_time]) == [17, 11.5, 20]


def test_a_request_ending_inside_a_window_gets_its_windows_tokens_with_its_end():
    """A (6 tokens out) and B (2) prefilled 0-3 and 3-6 ms; a window of 4 from 6 ms: both decode
    6-11 (B ends), A 11-13, 13-15, 15-17 (B idle); the next window opens at 17 ms: A decodes
    17-21 (3 ms + 1: A's 6th token, its end) and its last 3 steps run idle. A's tokens of the
    first window go as it is over, when the next step is launched (17 ms); its 6th, which ends it
    inside the second, at that window's end (24 ms), never before a token that came earlier."""
    ra, _ = run([Request("A", 0.0, [1, 2, 3, 4], 6), Request("B", 0.0, [5, 6, 7, 8], 2)], vllm060=True)
    assert ms(ra.token_times) == [6, 17, 17, 17, 17, 24] and ra.finish_time == pytest.approx(0.024)


def test_the_option_is_checked_and_reaches_an_in_process_run(tmp_path: Path):
    assert "frontend.output_timing='v1' is not allowed: step or vllm060" in _refusal("frontend.output_timing=v1")
    base = ("backend=sim", "workload=poisson", "workload.num_requests=40", "workload.rate=200", "scheduler=vllm_v0",
            "scheduler.num_scheduler_steps=8", "tracking.enabled=false")  # fmt: skip
    step = run_job(compose_config(*base), tmp_path / "step").summary
    late = run_job(compose_config(*base, "frontend.output_timing=vllm060"), tmp_path / "late").summary
    assert late["mean_ttft_ms"] > step["mean_ttft_ms"] and late["mean_e2el_ms"] > step["mean_e2el_ms"]
