"""The engine loop: clocks, arrivals, stopping rules, rejection, interruption."""

from __future__ import annotations

import time

import pytest

from paged_bench.backends.base import Backend
from paged_bench.core.clock import VirtualClock, WallClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.deferred_hashing import DeferredHashingPool
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import StepOutput, StepPlan
from paged_bench.core.request import FinishReason, Request
from paged_bench.run import job as app
from tests.test_schedulers import make_engine, reqs


class ScriptedBackend(Backend):
    """Samples ``token`` every time; each step lasts ``duration`` seconds."""

    clock = "virtual"

    def __init__(self, token: int = 7, duration: float = 0.01, eos: int | None = None) -> None:
        super().__init__()
        self.token, self.duration, self.eos_token_id = token, duration, eos
        self.plans: list[tuple[int, ...]] = []

    def execute(self, plan: StepPlan) -> StepOutput:
        self.plans.append(tuple(plan.num_new_tokens))
        return StepOutput([self.token] * plan.num_reqs, self.duration)


def engine_with(backend: Backend, **kw) -> Engine:
    engine = make_engine(**kw)
    engine.backend = backend
    engine.scheduler.end_token_ids = frozenset({backend.eos_token_id} - {None})
    return engine


def test_virtual_clock_jumps_idle_time_to_the_next_arrival():
    rs = reqs([(0.0, 4, 2), (5.0, 4, 2)])
    result = engine_with(ScriptedBackend(duration=0.01)).run(rs)
    assert rs[0].token_times == pytest.approx([0.01, 0.02])
    assert rs[1].first_scheduled_time == 5.0
    assert rs[1].token_times == pytest.approx([5.01, 5.02])
    assert result.duration == pytest.approx(5.02)
    assert len(result.steps) == 4  # no steps while idle


def test_arrivals_join_at_the_first_step_boundary_after_they_arrive():
    rs = reqs([(0.0, 4, 10), (0.015, 4, 2)])
    engine_with(ScriptedBackend(duration=0.01)).run(rs)
    assert rs[1].first_scheduled_time == pytest.approx(0.02)


def test_outputs_are_exactly_the_target_length_and_tokens_come_from_the_backend():
    rs = reqs([(0.0, 5, 9), (0.0, 3, 1)])
    engine_with(ScriptedBackend(token=42)).run(rs)
    assert rs[0].output_token_ids == [42] * 9 and rs[1].output_token_ids == [42]
    assert all(r.finish_reason is FinishReason.LENGTH for r in rs)


def test_eos_stops_a_request_unless_it_ignores_eos():
    rs = reqs([(0.0, 4, 10), (0.0, 4, 10)])
    rs[0].ignore_eos = False
    engine_with(ScriptedBackend(token=3, eos=3)).run(rs)
    assert rs[0].finish_reason is FinishReason.STOP and rs[0].num_output_tokens == 1
    assert rs[1].finish_reason is FinishReason.LENGTH and rs[1].num_output_tokens == 10


def test_eos_as_the_last_token_allowed_is_a_stop_as_vllm_reports_it():
    """vLLM v1's check_stop tests EOS before the length cap; the length went first here, so an
    EOS sampled as the last allowed token (max_tokens=1, or at max_model_len) read "length"."""
    rs = reqs([(0.0, 4, 1), (0.0, 60, 100)])
    for r in rs:
        r.ignore_eos = False
    engine_with(ScriptedBackend(token=3, eos=3), max_model_len=61).run(rs)
    assert [(r.finish_reason, r.num_output_tokens) for r in rs] == [(FinishReason.STOP, 1)] * 2


def test_a_sequence_stops_at_max_model_len():
    rs = reqs([(0.0, 60, 100)])
    engine_with(ScriptedBackend(), max_model_len=64).run(rs)
    assert rs[0].num_tokens == 64 and rs[0].finish_reason is FinishReason.LENGTH


def test_a_prompt_too_long_is_rejected_with_its_reason_and_others_go_on():
    rs = reqs([(0.0, 64, 2), (0.0, 4, 2)])
    result = engine_with(ScriptedBackend(), max_model_len=64).run(rs)
    assert rs[0].finish_reason is FinishReason.REJECTED and "max_model_len=64" in rs[0].error
    assert rs[1].finish_reason is FinishReason.LENGTH and result.error is None


def test_an_interrupted_run_ends_every_request_and_frees_the_pool():
    rs = reqs([(0.0, 8, 50), (0.0, 8, 50), (3.0, 8, 5)])

    def interrupt(now, finished):
        if now > 0.05:
            raise KeyboardInterrupt

    engine = engine_with(ScriptedBackend())
    result = engine.run(rs, on_step=interrupt)
    assert result.interrupted and result.error == "interrupted"
    assert all(r.finish_reason is FinishReason.ABORT for r in rs)
    assert "not submitted" in rs[2].error
    assert result.leaks == [] and engine.allocator.num_free_blocks == engine.allocator.layout.num_blocks


def test_an_interrupt_inside_the_step_bookkeeping_leaks_nothing():
    """Ctrl-C or SIGTERM can land anywhere: here after a request has finished and left the
    running list but before its blocks are freed, where the scheduler's lists no longer reach
    the request that holds them."""
    rs = reqs([(0.0, 8, 3), (0.0, 8, 40), (0.02, 8, 40)])

    class InterruptedFree(PagedAllocator):  # an override: the compiled core calls its own methods
        fired = False

        def free(self, req):
            if not self.fired and req.is_finished and not engine.scheduler.running.count(req):
                self.fired = True
                raise KeyboardInterrupt
            super().free(req)

    engine = engine_with(ScriptedBackend(), allocator=InterruptedFree(num_blocks=64, block_size=4))
    result = engine.run(rs)
    assert result.interrupted and all(r.is_finished for r in rs)
    assert result.leaks == [] and engine.allocator.num_free_blocks == engine.allocator.layout.num_blocks


@pytest.mark.parametrize(("operation", "on_call"), [("get_new_blocks", 4), ("free_blocks", 2), ("cache_full_blocks", 3)])
def test_an_interrupt_inside_a_pool_operation_leaks_nothing(operation, on_call):
    """An interrupt inside the block pool: after an allocation took its blocks and before any
    table records them, halfway through a table's release (its table already dropped), or
    while a table that has just grown indexes its full blocks (its slot count already moved)."""
    rs = reqs([(0.0, 8, 40), (0.0, 8, 40), (0.01, 8, 40)])
    engine = engine_with(ScriptedBackend())
    calls = {"n": 0}

    class Torn(DeferredHashingPool):  # an override, not a patched attribute: the compiled core calls methods directly
        def get_new_blocks(self, n):
            return self.torn(super().get_new_blocks, n)

        def free_blocks(self, blocks):
            return self.torn(super().free_blocks, list(blocks))

        def cache_full_blocks(self, blocks, hashes):
            return self.torn(super().cache_full_blocks, blocks, hashes)

        def torn(self, real, first, *rest):
            calls["n"] += real.__name__ == operation
            if real.__name__ != operation or calls["n"] != on_call:  # the signal lands once
                return real(first, *rest)
            if operation == "free_blocks":
                real(first[: len(first) // 2 + 1])  # half released, then the signal
            else:
                real(first, *rest)  # done, then the signal: the caller never sees it
            raise KeyboardInterrupt

    engine.allocator.pool = Torn(engine.allocator.layout.num_blocks)
    result = engine.run(rs)
    assert result.interrupted and calls["n"] >= on_call
    assert result.leaks == [] and engine.allocator.num_free_blocks == engine.allocator.layout.num_blocks


def test_step_records_add_up():
    rs = reqs([(0.0, 10, 3), (0.0, 6, 4)])
    result = engine_with(ScriptedBackend()).run(rs)
    first = next(result.steps.rows())
    assert first.prefill_tokens == 16 and first.decode_tokens == 0
    assert first.kv_live_slots == 16 and first.kv_reserved_slots == (3 + 2) * 4
    decodes = sum(s.decode_tokens for s in result.steps)
    assert decodes == (3 - 1) + (4 - 1)  # the first token of each comes from its prefill


def test_wall_clock_paces_a_modelled_step_in_real_time():
    clock = WallClock()
    clock.start()
    t0 = time.perf_counter()
    end = clock.advance(clock.now(), 0.05)
    assert time.perf_counter() - t0 >= 0.05 and end >= 0.05


def test_virtual_clock_never_goes_back():
    clock = VirtualClock()
    clock.wait_until(2.0)
    clock.wait_until(1.0)
    assert clock.now() == 2.0


def test_same_seed_same_run_bit_for_bit(config):
    from paged_bench.run.bench import build

    def run():
        bench = build(config("scheduler=preemptive", "num_blocks=40", "workload.rate=100"))
        result = bench.engine.run(bench.requests)
        return list(result.steps.rows()), [(r.token_times, r.num_preemptions) for r in result.requests]

    assert run() == run()


def test_requests_share_nothing_across_runs(config):
    from paged_bench.run.bench import build

    a, b = build(config()), build(config())
    assert a.requests[0] is not b.requests[0]
    assert [r.token_ids for r in a.requests] == [r.token_ids for r in b.requests]


def test_a_request_is_a_plain_value():
    r = Request("x", 1.5, [1, 2, 3], 4)
    assert (r.num_prompt_tokens, r.num_tokens, r.num_output_tokens, r.first_token_time) == (3, 3, 0, None)
    r.token_ids.append(9)
    assert r.output_token_ids == [9] and r.prompt_token_ids == [1, 2, 3]


def test_when_a_figure_fails_to_compute_the_steps_still_reach_the_disk(config, tmp_path, monkeypatch):
    def broken_summary(*args, **kwargs):
        raise ZeroDivisionError("a metrics bug")

    monkeypatch.setattr(app, "summarize", broken_summary)
    with pytest.raises(ZeroDivisionError):
        app.run_job(config("workload.num_requests=20", "tracking.enabled=false"), tmp_path)
    rows = (tmp_path / "steps.csv").read_text().splitlines()
    assert rows[0].startswith("step,time,duration,batch_size") and len(rows) > 20


@pytest.mark.parametrize(
    "overrides",
    [
        ("backend.per_decode_seq_ms=1e308",),  # a step past float's range: the clock went to inf
        ("backend.step_overhead_ms=1e13",),  # 1e10 s a step: the horizon mid-run, some requests done
    ],
)
def test_a_clock_past_its_horizon_stops_the_run_with_every_figure_finite(config, tmp_path, overrides):
    outcome = app.run_job(config(*overrides, "tracking.enabled=false"), tmp_path)
    assert outcome.status == "failed" and "would pass 1e+12 s" in outcome.error
    assert not outcome.result.leaks
    text = (tmp_path / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    reasons = [line.split(",")[14] for line in (tmp_path / "requests.csv").read_text().splitlines()[1:]]
    assert len(reasons) == 48 and all(reasons) and "error" in reasons


def test_a_prefilled_request_handed_over_stops_on_eos_before_its_length():
    from paged_bench.cluster.handoff import prefill_copy, take_prefill

    (req,) = reqs([(0.0, 4, 1)])
    req.ignore_eos = False
    copy = prefill_copy(req)
    copy.token_ids.append(3)
    copy.token_times.append(0.1)
    assert take_prefill(req, copy, max_model_len=64, end_token_ids=frozenset({3})) is False
    assert req.finish_reason is FinishReason.STOP and req.output_token_ids == [3]


def test_duration_lasts_until_every_request_has_returned_as_vllm_times_it():
    """vLLM's benchmark_duration ends when every request has returned, failed ones included; a
    request refused at its arrival after the last step was left out (duration 0.02 s, not 5)."""
    rs = reqs([(0.0, 4, 2), (5.0, 600, 2)])
    result = engine_with(ScriptedBackend(duration=0.01), max_model_len=64).run(rs)
    assert rs[1].finish_reason is FinishReason.REJECTED and result.duration == pytest.approx(5.0)


def test_a_cost_model_dearer_by_a_factor_is_the_same_run_on_a_clock_slower_by_it(config, tmp_path):
    """What ``benchmarks/sim_vs_numpy.py``'s cost +-3% row rests on: the engine is the same at
    every time scale, so every step 3% dearer gives, event for event, the run whose arrivals
    come 3% more often, every time read 3% longer (a preemptive pool, so scheduling is exercised)."""
    factor, prices = 1.03, ("step_overhead_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_kv_token_us",
                            "per_swap_block_ms")  # fmt: skip
    setting = ("backend=sim", "workload=seed", "scheduler=preemptive", "num_blocks=32", "tracking.enabled=false")
    cfg = config(*setting)

    def summary(*overrides):
        return app.run_job(config(*setting, *overrides), tmp_path / str(len(list(tmp_path.iterdir())))).summary

    dearer = summary(*(f"backend.{key}={cfg['backend'][key] * factor!r}" for key in prices))
    slower = summary(f"workload.rate={cfg['workload']['rate'] * factor!r}")
    assert dearer["num_preemptions"] == slower["num_preemptions"] > 0
    for key in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "median_e2el_ms", "duration"):
        assert dearer[key] == pytest.approx(slower[key] * factor, rel=1e-12)
    assert dearer["output_throughput"] == pytest.approx(slower["output_throughput"] / factor, rel=1e-12)
