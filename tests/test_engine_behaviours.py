"""The engine behaviours users compare against, each pinned with hand-derived values: vLLM 0.x's
prompt-only steps (``scheduler.prefill_first``), the chunked-prefill order (decodes first, then
prompt chunks in the budget left), vLLM 0.6's multi-step scheduling
(``scheduler.num_scheduler_steps``) and a priced front end (``frontend``)."""

from __future__ import annotations

import pytest

from paged_bench.backends.sim import SimBackend
from paged_bench.core.clock import VirtualClock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import StepPlan
from paged_bench.core.request import Request
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from paged_bench.core.scheduler.preemptive import PreemptiveScheduler
from paged_bench.errors import ConfigError
from paged_bench.run.compose import compose_config
from paged_bench.run.config import BenchConfig
from paged_bench.run.frontend import FrontendSettings, intake, receive_through, send_through
from paged_bench.serve.server import build_app
from tests.test_core_behaviours import rows, step


def scheduler(budget: int = 64, num_blocks: int = 16, **kw) -> ContinuousScheduler:
    alloc = PagedAllocator(num_blocks=num_blocks, block_size=4, prefix_caching=False)
    return ContinuousScheduler(alloc, max_model_len=64, max_batch=4, max_num_batched_tokens=budget, **kw)


def a_decoding(sched: ContinuousScheduler) -> Request:
    """A (4-token prompt) prefilled in step 1 and decoding in step 2: 6 tokens, 5 computed."""
    a = Request("A", 0.0, [1, 2, 3, 4], 10)
    sched.add_request(a, 0.0)
    assert rows(step(sched)) == [("A", 0, 4)] and rows(step(sched)) == [("A", 4, 1)]
    return a


@pytest.mark.parametrize(("prefill_first", "expected"), [
    (True, [[("B", 0, 3)], [("A", 5, 1), ("B", 3, 1)]]),  # vLLM 0.x: B's prompt step stalls A
    (False, [[("A", 5, 1), ("B", 0, 3)], [("A", 6, 1), ("B", 3, 1)]]),  # vLLM v1: mixed
])  # fmt: skip
def test_a_prompt_step_runs_no_decodes_with_prefill_first(prefill_first, expected):
    sched = scheduler(chunked_prefill=False, prefill_first=prefill_first)
    a_decoding(sched)
    sched.add_request(Request("B", 0.0, [5, 6, 7], 10), 0.0)
    assert [rows(step(sched)), rows(step(sched))] == expected


def test_chunked_prefill_runs_the_decodes_first_then_a_chunk_of_what_the_budget_has_left():
    """vLLM 0.x's ``_schedule_chunked_prefill`` order (and v1's): budget 8, A decoding, B's
    12-token prompt in chunks of 7 (8 less A's decode) and 5."""
    sched = scheduler(budget=8)
    a_decoding(sched)
    sched.add_request(Request("B", 0.0, list(range(20, 32)), 10), 0.0)
    assert rows(step(sched)) == [("A", 5, 1), ("B", 0, 7)]
    assert rows(step(sched)) == [("A", 6, 1), ("B", 7, 5)]


def test_a_request_arriving_inside_a_multi_step_window_waits_for_its_end():
    sched = scheduler(chunked_prefill=False, prefill_first=True, num_scheduler_steps=3)
    a_decoding(sched)  # step 2, A's decode alone, opened a window of 3 steps
    sched.add_request(Request("B", 0.0, [5, 6, 7], 10), 0.0)
    plans = [step(sched) for _ in range(4)]
    assert [rows(p) for p in plans] == [[("A", 5, 1)], [("A", 6, 1)], [("B", 0, 3)], [("A", 7, 1), ("B", 3, 1)]]
    assert [p.window_step for p in plans] == [1, 2, 0, 0]


def test_a_request_ending_inside_a_window_stays_in_its_batch_until_the_window_ends():
    """16 blocks of 4. Step 1 prefills A (3 tokens out) and C, a block each; step 2 opens a
    window of 4 and their decodes at position 4 take a block each (12 free). A ends in step 3:
    vLLM 0.6 still computes it in steps 4 and 5 (an idle row at its 6 computed tokens, its
    sample dropped) and its 2 blocks stay held; step 5 ends the window, A's blocks come back
    (14 free); step 6 opens the next window, C's position 8 takes one (13), and the plan says A
    is gone."""
    sched = scheduler()
    sched.num_scheduler_steps = 4
    a, c = Request("A", 0.0, [1, 2, 3, 4], 3), Request("C", 0.0, [5, 6, 7, 8], 10)
    for req in (a, c):
        sched.add_request(req, 0.0)
    plans = [step(sched) for _ in range(3)]
    assert a.is_finished and a not in sched.running and [p.window_step for p in plans] == [0, 0, 1]
    assert [p.idle_rows for p in plans] == [{}, {}, {}]
    fourth = step(sched)
    assert rows(fourth) == [("C", 6, 1)] and fourth.idle_rows == {"A": 6} and sched.allocator.num_free_blocks == 12
    fifth = step(sched)
    assert rows(fifth) == [("C", 7, 1)] and fifth.idle_rows == {"A": 6} and sched.allocator.num_free_blocks == 14
    last = step(sched)
    assert rows(last) == [("C", 8, 1)] and last.window_step == 0 and last.idle_rows == {}
    assert last.finished_req_ids == ("A",) and sched.allocator.num_free_blocks == 13
    assert rows(fifth.as_computed()) == [("C", 7, 1), ("A", 6, 1)] and fifth.as_computed().num_decode_tokens == 2


def sim_engine(num_scheduler_steps: int = 1) -> Engine:
    """A linear simulator priced by hand: 3 ms a step, 1 ms a decoding sequence, nothing else."""
    alloc = PagedAllocator(num_blocks=64, block_size=4, prefix_caching=False)
    sched = ContinuousScheduler(alloc, max_model_len=64, max_batch=8, max_num_batched_tokens=64,
                                num_scheduler_steps=num_scheduler_steps)  # fmt: skip
    backend = SimBackend(step_overhead_ms=3.0, per_prefill_token_ms=0.0, per_decode_seq_ms=1.0,
                         per_kv_token_us=0.0, per_swap_block_ms=0.0)  # fmt: skip
    backend.bind(alloc)
    return Engine(sched, backend, VirtualClock())


@pytest.mark.parametrize(("n", "ms"), [
    (1, [3, 7, 11, 15, 19, 23, 27, 31, 35]),  # 3 ms prefill, then 4 ms a decode
    (2, [3, 7, 8, 12, 13, 17, 18, 22, 23]),
    (4, [3, 7, 8, 9, 10, 14, 15, 16, 17]),  # a window's later steps skip the 3 ms overhead
])  # fmt: skip
def test_multi_step_pays_the_per_step_overhead_once_a_window(n, ms):
    req = Request("A", 0.0, [1, 2, 3, 4], 9)
    result = sim_engine(n).run([req])
    assert req.token_times == pytest.approx([t / 1e3 for t in ms]) and result.leaks == []


def test_an_arrival_inside_a_window_is_scheduled_at_its_end():
    """A's first window runs 3-7-8-9-10 ms; B, sent at 7.5 ms, is admitted at 10 ms, in a mixed
    step (A's decode and B's prompt: 4 ms) that ends at 14 ms."""
    a, b = Request("A", 0.0, [1, 2, 3, 4], 9), Request("B", 0.0075, [5, 6, 7], 3)
    result = sim_engine(4).run([a, b])
    assert b.first_scheduled_time == pytest.approx(0.010) and b.token_times[0] == pytest.approx(0.014)
    assert result.leaks == [] and a.is_finished and b.is_finished


def test_a_window_whose_requests_all_ended_runs_to_its_last_step():
    """A's window opens at 3 ms (its decode: 3 + 1 = 7 ms); A ends in the window's second step
    (8 ms); the window's last two steps still compute it (an idle row, 1 ms each: 9, 10 ms), as
    vLLM 0.6 does. B, sent at 8.5 ms, is admitted when the window ends (10 ms) and its prompt step ends at
    13 ms; had the window stopped with A, B would have started at once."""
    a, b = Request("A", 0.0, [1, 2, 3, 4], 3), Request("B", 0.0085, [5, 6, 7], 2)
    engine = sim_engine(4)
    result = engine.run([a, b])
    assert a.token_times == pytest.approx([0.003, 0.007, 0.008])
    assert b.first_scheduled_time == pytest.approx(0.010) and b.token_times[0] == pytest.approx(0.013)
    assert result.leaks == [] and b.is_finished and engine.allocator.num_free_blocks == 64


def served(reqs: list[Request], frontend: FrontendSettings) -> list[Request]:
    sent = send_through(reqs, frontend)
    receive_through(sim_engine().run(reqs), sent, frontend)
    return reqs


def test_the_front_end_adds_its_price_to_ttft_and_leaves_a_light_loads_itl():
    """In-process the tokens come at 3, 7, 11 ms. The request reaches the engine 10 ms after it
    was sent (13, 17, 21) and each token takes the front end 1 ms (14, 18, 22): TTFT 3 + 10 + 1."""
    (req,) = served([Request("A", 0.0, [1, 2, 3, 4], 3)], FrontendSettings(request_ms=10.0, token_ms=1.0))
    assert req.arrival_time == 0.0 and req.token_times == pytest.approx([0.014, 0.018, 0.022])
    assert req.finish_time == pytest.approx(0.022)


def test_a_front_end_slower_than_the_steps_sets_the_itl():
    """Four requests: the engine's steps end at 3, 10 (four decodes: 7 ms), 17 ms. Each step's
    four tokens take the front end 4 x 2 = 8 ms, each step's after the previous one's: 11, 19, 27."""
    reqs = served([Request(i, 0.0, [i, 1, 2, 3], 3) for i in range(4)], FrontendSettings(token_ms=2.0))
    assert all(r.token_times == pytest.approx([0.011, 0.019, 0.027]) for r in reqs)


@pytest.mark.parametrize(("sent", "through"), [
    ([0.0, 0.0, 0.0], [0.006, 0.006, 0.006]),  # a burst: taken in 2 ms each, handed on together at 6 ms
    ([0.0, 0.010], [0.002, 0.012]),  # the second finds the intake idle: each alone, 2 ms late
    ([0.010, 0.0, 0.001], [0.012, 0.004, 0.004]),  # the third comes while the first is taken in (0-2 ms)
])  # fmt: skip
def test_the_intake_hands_a_busy_spells_requests_on_together(sent, through):
    assert intake(sent, [0.002] * len(sent)) == pytest.approx(through)


def test_a_burst_through_the_intake_waits_for_its_last_request():
    """Two requests sent at 0 are through the intake at 2 x 5 = 10 ms; in-process both prompts
    run in one 3 ms step, so each TTFT is 13 ms, counted from the send."""
    reqs = served([Request(i, 0.0, [i, 1, 2, 3], 2) for i in range(2)], FrontendSettings(intake_ms=5.0))
    assert all(r.arrival_time == 0.0 and r.token_times[0] == pytest.approx(0.013) for r in reqs)


def test_the_intake_prices_each_prompt_token_too():
    """Prompts of 4 and 40 tokens at 1 ms + 50 us a token: taken in in 1.2 and 3 ms, both through
    at 4.2 ms; both prompts in one 3 ms step after: first tokens at 7.2 ms."""
    prompts = [[0, 1, 2, 3], list(range(40))]
    reqs = served([Request(i, 0.0, p, 2) for i, p in enumerate(prompts)],
                  FrontendSettings(intake_ms=1.0, intake_token_us=50.0))  # fmt: skip
    assert [r.token_times[0] for r in reqs] == pytest.approx([0.0072, 0.0072])


def _refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        BenchConfig.from_config(compose_config(*overrides))
    return str(e.value)


def test_the_options_are_checked_where_the_config_is_read():
    chunked = _refusal("scheduler.prefill_first=true")
    assert "scheduler.prefill_first=True is not allowed: false while scheduler.chunked_prefill is true" in chunked
    assert "scheduler.num_scheduler_steps=0 is not allowed" in _refusal("scheduler.num_scheduler_steps=0")
    assert "frontend=none with target=openai" in _refusal("target=openai", "frontend=paged_bench_http")
    assert "frontend.token_ms=-1 is not allowed" in _refusal("frontend.token_ms=-1")
    assert "scheduler.long_prefill_token_threshold=-1 is not allowed: an integer from 0 to" in _refusal(
        "scheduler.long_prefill_token_threshold=-1")  # 0 is no cap
    assert "frontend.intake_ms=-2 is not allowed" in _refusal("frontend.intake_ms=-2")
    assert "frontend.intake_token_us=-1 is not allowed" in _refusal("frontend.intake_token_us=-1")
    with pytest.raises(ConfigError, match="frontend=none for the server"):  # its own front end is real
        build_app(compose_config("frontend=paged_bench_http", config_name="serve"))


def test_scheduler_vllm_v0_is_preemptive_with_prompt_steps_first_and_no_chunking():
    choice = BenchConfig.from_config(compose_config("scheduler=vllm_v0", "scheduler.num_scheduler_steps=10"))
    sched = choice.plugins["scheduler"].build(PagedAllocator(num_blocks=200, block_size=16), max_model_len=512)
    assert isinstance(sched, PreemptiveScheduler) and sched.prefill_first and not sched.chunked_prefill
    assert sched.num_scheduler_steps == 10 and sched.admission_reserve_blocks == 2  # vLLM 0.x's 1% watermark


def test_the_long_prefill_cap_is_a_scheduler_option_the_server_config_sets_to_256():
    """One knob for the benchmark and the server (a target=served run's server takes the run's
    scheduler section): 0 in the benchmark's config, 256 in conf/serve.yaml, any scheduler."""
    alloc = PagedAllocator(num_blocks=200, block_size=16)
    for config, overrides, cap in (("config", ("scheduler=preemptive",), 0), ("serve", ("scheduler=continuous",), 256),
                                   ("config", ("scheduler.long_prefill_token_threshold=64",), 64)):
        cfg = compose_config(*overrides, config_name=config)
        choice = BenchConfig.from_config({k: v for k, v in cfg.items() if k != "server"})  # as build_app reads it
        assert choice.plugins["scheduler"].build(alloc, max_model_len=512).long_prefill_token_threshold == cap


def test_a_rooflines_window_step_is_priced_without_its_per_step_overhead():
    backend = SimBackend(cost_model="roofline", hardware="h100")
    plan = StepPlan((0, 1), (300, 40), (1, 1), num_decode_tokens=2)
    first, later = backend.execute(plan).duration, backend.execute(plan._replace(window_step=1)).duration
    assert first - later == pytest.approx(backend.roofline.hardware.overhead) and backend.roofline.hardware.overhead > 0


def test_a_measured_window_step_costs_its_gpu_part_and_the_sampler_alone():
    backend = SimBackend(cost_model="measured", hardware="h100")
    plan = StepPlan((0, 1), (300, 40), (1, 1), num_decode_tokens=2)
    cost = backend.measured.step_cost(plan, backend._block_size)
    first, later = backend.execute(plan).duration, backend.execute(plan._replace(window_step=1)).duration
    assert first == pytest.approx(cost.total) and later == pytest.approx(cost.gpu + cost.cpu_each_step)
    assert 0 < cost.cpu_each_step < 0.6 * cost.cpu  # schedule + prepare inputs + output processing are skipped


@pytest.mark.parametrize("cost_model", ["linear", "roofline", "measured"])
def test_a_windows_idle_rows_are_priced_as_the_decodes_vllm_computes(cost_model):
    """Request 1 ended earlier in the window: priced as a decode of its 40 tokens, on the GPU and
    in the sampler's CPU, as if it were still a row; the step samples for row 0 alone."""
    backend = SimBackend(cost_model=cost_model, hardware="h100")
    backend.bind(PagedAllocator(num_blocks=64, block_size=16))
    live = StepPlan((0,), (300,), (1,), num_decode_tokens=1, window_step=3)
    idle = live._replace(idle_rows={1: 40})
    both = StepPlan((0, 1), (300, 40), (1, 1), num_decode_tokens=2, window_step=3)
    assert backend.execute(idle).duration == pytest.approx(backend.execute(both).duration)
    assert backend.execute(idle).duration > backend.execute(live).duration and backend.execute(idle).token_ids == [0]
    assert not StepPlan((), idle_rows={1: 40}).is_empty


def test_with_prefill_first_a_swapped_out_request_comes_back_after_the_decodes_not_in_a_prompt_step():
    """vLLM 0.x's ``_schedule_default``: no prompt step while a request is swapped out; the
    running decode, then it swaps in, and a waiting prompt waits for a step of its own. 4 blocks
    of 4: step 1 prefills A (2 tokens out), B and C (a 3-token prompt), a block each; in step 2
    A's and B's decodes need a block each and one is free: C, the last admitted, is swapped out.
    A ends (2 blocks free). Step 3: B decodes, C swaps in (one block); D, which fits the last
    block, waits: step 4 is its prompt step, with no decode."""
    alloc = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=False, swap_blocks=8)
    sched = PreemptiveScheduler(alloc, max_model_len=64, max_batch=4, max_num_batched_tokens=64,
                                chunked_prefill=False, prefill_first=True, mode="swap")  # fmt: skip
    for rid, prompt, max_tokens in (("A", [1, 2, 3, 4], 2), ("B", [1, 2, 3, 4], 10), ("C", [5, 6, 7], 10)):
        sched.add_request(Request(rid, 0.0, prompt, max_tokens), 0.0)
    assert rows(step(sched)) == [("A", 0, 4), ("B", 0, 4), ("C", 0, 3)]
    second = step(sched)
    assert rows(second) == [("A", 4, 1), ("B", 4, 1)] and len(second.swap_out) == 1
    sched.add_request(Request("D", 0.0, [8, 9, 10, 11], 10), 0.0)
    third = step(sched)
    assert rows(third) == [("B", 5, 1), ("C", 3, 1)] and len(third.swap_in) == 1
    assert rows(step(sched)) == [("D", 0, 4)]
