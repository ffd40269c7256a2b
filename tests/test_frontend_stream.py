"""An API server in the engine's own process (``frontend.stream_ms``, vLLM 0.5.x): each step's
streamed outputs cost the engine ``stream_ms`` each before its next step, pinned by hand on the
linear simulator of tests/test_engine_behaviours.py and through the config on a burst."""

from __future__ import annotations

from pathlib import Path

import pytest

from paged_bench.core.request import Request
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job
from tests.test_engine_behaviours import _refusal, sim_engine


def test_each_steps_outputs_are_streamed_before_the_next_step():
    """Two 3-token requests: both prompts in a 3 ms step, then two decode steps of 3 + 2 x 1 ms
    (ends 3, 8, 13 ms). Streaming 0.5 ms an output adds 2 x 0.5 ms to each step: 4, 10, 16 ms."""
    engine = sim_engine()
    engine.stream_s = 0.5e-3
    reqs = [Request(i, 0.0, [i, 1, 2, 3], 3) for i in range(2)]
    result = engine.run(reqs)
    assert all(r.token_times == pytest.approx([0.004, 0.010, 0.016]) for r in reqs)
    assert result.duration == pytest.approx(0.016) and result.steps.column("duration") == pytest.approx(
        [0.004, 0.006, 0.006]
    )


def test_the_option_is_checked_and_slows_an_in_process_run_by_outputs_times_its_price(tmp_path: Path):
    assert "frontend.stream_ms=-1 is not allowed" in _refusal("frontend.stream_ms=-1")
    base = ("backend=sim", "workload=poisson", "workload.num_requests=10", "workload.rate=inf", "scheduler=vllm_v0",
            "tracking.enabled=false")  # fmt: skip
    alone = run_job(compose_config(*base), tmp_path / "alone").summary
    shared = run_job(compose_config(*base, "frontend.stream_ms=0.25"), tmp_path / "shared").summary
    # every request there at once: the same steps, each later by its outputs x 0.25 ms
    assert shared["duration"] - alone["duration"] == pytest.approx(alone["total_output_tokens"] * 0.25e-3)
