"""Issue 8's engine figures: KV sampled while the step holds it, waste at one step, prefix
blocks cached at allocation, preempted hits apart, sha256 block hashes, validation."""

from __future__ import annotations

import pytest

from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.request import Request
from paged_bench.core.scheduler.preemptive import PreemptiveScheduler
from paged_bench.errors import ConfigError
from paged_bench.model.logprobs import LogprobsRequest
from paged_bench.results.metrics import summarize
from paged_bench.run import registry
from tests.test_metrics import result as metrics_result
from tests.test_metrics import step
from tests.test_schedulers import make_engine, reqs


def test_kv_is_sampled_before_finished_requests_are_freed():
    # one request, prompt 32, 2 output tokens, block 16: its 2nd step holds 33 live in 48
    (r,) = rs = reqs([(0.0, 32, 2)])
    result = make_engine(block_size=16).run(rs)
    s = summarize(result)
    assert r.num_output_tokens == 2
    assert s["kv_live_slots_peak"] == 33 and s["kv_reserved_slots_peak"] == 48
    assert s["kv_waste_pct"] == pytest.approx(100 * (1 - 33 / 48))


def test_kv_waste_compares_live_and_reserved_at_the_same_step():
    # live peaks (30) at a step where reserved is 32; reserved peaks (48) with 10 live
    s = summarize(metrics_result([], [step(1.0, 1.0, 30, 32), step(2.0, 1.0, 10, 48)]))
    assert s["kv_live_slots_peak"] == 30 and s["kv_reserved_slots_peak"] == 48
    assert s["kv_waste_pct"] == pytest.approx(100 * (1 - 10 / 48))


def test_identical_prompts_admitted_in_the_same_step_share_blocks():
    # vLLM v1 caches blocks as they are scheduled: the second prompt hits 3 of 4 blocks
    prompt = list(range(64))
    rs = [Request(0, 0.0, list(prompt), 4), Request(1, 0.0, list(prompt), 4)]
    result = make_engine(block_size=16, num_blocks=32).run(rs)
    assert result.prefix_hit_tokens == 48 and result.prefix_query_tokens == 128
    assert rs[1].num_cached_tokens == 48 and result.leaks == []


def test_a_request_that_skips_the_cache_lookup_is_no_prefix_query():
    """vLLM's record_prefix_cache_stats: a request that skipped the lookup (it scores its
    prompt) is not counted; nor is any with prefix caching off."""
    prompt = list(range(64))
    rs = [Request(0, 0.0, list(prompt), 4), LogprobsRequest(1, 0.001, list(prompt), 4, want_prompt_logprobs=True)]
    result = make_engine(block_size=16, num_blocks=32).run(rs)
    assert rs[1].num_cached_tokens == 0 and result.prefix_query_tokens == 64 and result.prefix_hit_tokens == 0
    no_cache = PagedAllocator(num_blocks=32, block_size=16, prefix_caching=False)
    off = make_engine(allocator=no_cache).run([Request(0, 0.0, list(prompt), 4)])
    assert off.prefix_query_tokens == 0 and summarize(off)["prefix_cache_hit_rate"] == 0.0


def test_a_victim_reviving_its_own_blocks_is_counted_apart():
    rs = reqs([(0.0, 40, 50), (0.001, 40, 50)])
    result = make_engine(PreemptiveScheduler, num_blocks=28, block_size=4).run(rs)
    assert result.num_preemptions > 0 and result.preempted_prefix_hit_tokens > 0
    s = summarize(result)
    assert s["prefix_cache_hit_rate"] == 0.0 and s["preempted_prefix_hit_tokens"] == result.preempted_prefix_hit_tokens


@pytest.mark.parametrize("prefix_hash", ["builtin", "sha256"])
def test_prefix_hash_options_find_the_same_hits(prefix_hash):
    alloc = PagedAllocator(num_blocks=16, block_size=4, prefix_hash=prefix_hash)
    a = Request(0, 0.0, list(range(12)), 2)
    assert alloc.allocate_slots(a, 12, alloc.lookup_prefix(a)) is not None
    b = Request(1, 0.0, list(range(8)) + [99, 98, 97, 96, 95], 2)
    assert alloc.lookup_prefix(b).num_tokens == 8
    if prefix_hash == "sha256":  # 32-byte digests over (parent, tokens, extra keys)
        assert all(isinstance(h, bytes) and len(h) == 32 for h in alloc.pool.cached)


def test_the_server_defaults_to_sha256_and_the_simulator_to_the_builtin_hash(config):
    assert config()["allocator"]["prefix_hash"] == "builtin"
    assert config(config_name="serve")["allocator"]["prefix_hash"] == "sha256"
    with pytest.raises(ConfigError, match="allocator.prefix_hash"):
        registry.create("allocator", "paged", num_blocks=4, block_size=4, prefix_hash="md5")


def test_a_budget_below_max_batch_is_refused_as_vllm_does():
    alloc = PagedAllocator(num_blocks=16, block_size=4)
    with pytest.raises(ConfigError, match="max_num_batched_tokens=8.*max_batch=16"):
        registry.create("scheduler", "continuous", alloc, max_model_len=8, max_batch=16, max_num_batched_tokens=8)


def test_swap_in_keeps_the_watermark_free():
    alloc = PagedAllocator(num_blocks=8, block_size=4, swap_blocks=4)
    r = Request(0, 0.0, list(range(8)), 4)
    assert alloc.allocate_slots(r, 8) is not None
    r.num_computed_tokens = 8
    assert alloc.swap_out(r) is not None
    r.token_ids.append(0)
    assert alloc.swap_in(r, 1, min_free_blocks=6) is None  # 3 blocks would leave 5 free
    assert alloc.swap_in(r, 1, min_free_blocks=5) is not None
    alloc.free(r)
    assert alloc.leaks() == []


def _victim(victim: str) -> int:
    alloc = PagedAllocator(num_blocks=64, block_size=4)
    sched = registry.create("scheduler", "preemptive", alloc, max_model_len=64, max_batch=4, max_num_batched_tokens=64,
                            victim=victim)  # fmt: skip
    early, late = Request("early", 0.0, [1, 2], 4), Request("late", 1.0, [3, 4], 4)
    sched.running = [late, early]  # "early" came back from a preemption after "late" was admitted
    return sched.choose_victim(Request("x", 2.0, [5], 1)).request_id


def test_the_default_victim_is_the_last_admitted_and_latest_arrival_is_an_option(config):
    assert _victim("last_admitted") == "early" and _victim("latest_arrival") == "late"
    assert config("scheduler=preemptive")["scheduler"]["victim"] == "last_admitted"
    with pytest.raises(ConfigError, match="scheduler.victim"):
        _victim("oldest")


def test_builtin_block_hashes_are_the_same_in_every_process():
    import subprocess
    import sys

    code = (
        "from paged_bench.core.kv.paged import PagedAllocator\n"
        "from paged_bench.core.request import Request\n"
        "a = PagedAllocator(num_blocks=4, block_size=2, defer_unshared=False)\n"
        "a.allocate_slots(Request(0, 0.0, [1, 2, 3, 4, 5], 1), 5)\n"
        "print(list(a.pool.cached))"
    )
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}  # fmt: skip
    assert len(runs) == 1
