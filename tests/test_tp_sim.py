"""Hardware-sized KV pools and simulated tensor parallelism (issue 12 items 1-2): num_blocks=auto
lands where vLLM lands, refuses a model that does not fit, keeps the old default where no
hardware is known; TP splits weights and KV heads and pays two all-reduces per layer."""

from __future__ import annotations

import json

import pytest

from paged_bench.costmodel.roofline import HARDWARE, RooflineCost
from paged_bench.costmodel.step_work import StepWork
from paged_bench.costmodel.tp_link import LINKS
from paged_bench.errors import ConfigError
from paged_bench.model.config import PRESETS
from paged_bench.run.bench import build
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job
from paged_bench.sizing.tp_shard import TPShard, tp_shard
from tests.tracking_support import call_cli

ROOFLINE = ("backend=sim", "backend.cost_model=roofline", "tracking.enabled=false")


def test_auto_pool_for_llama_3_8b_on_one_h100_is_where_vllm_lands():
    bench = build(compose_config(*ROOFLINE, "workload.num_requests=2"))
    budget, layout = bench.kv_budget, bench.engine.allocator.layout
    assert budget is not None and budget.hardware == "h100" and budget.tensor_parallel_size == 1
    assert 350_000 <= layout.num_slots <= 500_000  # vLLM logs ~450k tokens for this pair
    assert layout.num_blocks == budget.tokens // 16 and budget.tokens * 131_072 <= budget.kv_bytes
    # the terms are the arithmetic the docs show: 0.9 of the device less weights and activations
    assert budget.requested == pytest.approx(0.9 * HARDWARE["h100"].memory_bytes, abs=1)
    assert budget.weights == PRESETS["llama-3-8b"].num_params * 2
    assert budget.kv_bytes == budget.requested - budget.weights - budget.activations - budget.non_torch


def test_less_memory_utilisation_or_more_batched_tokens_leave_less_kv():
    base = build(compose_config(*ROOFLINE, "workload.num_requests=2")).kv_budget.tokens
    util = build(compose_config(*ROOFLINE, "workload.num_requests=2", "backend.gpu_memory_utilization=0.5"))
    tokens = build(compose_config(*ROOFLINE, "workload.num_requests=2", "max_num_batched_tokens=65536"))
    assert util.kv_budget.tokens < base / 2 and tokens.kv_budget.tokens < base


def test_tp_splits_the_kv_heads_so_the_pool_holds_more_tokens():
    one = build(compose_config(*ROOFLINE, "workload.num_requests=2")).kv_budget
    two = build(compose_config(*ROOFLINE, "workload.num_requests=2", "backend.tensor_parallel_size=2")).kv_budget
    assert two.weights == pytest.approx(one.weights / 2, rel=0.01)
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2
    assert 2 * one.tokens < two.tokens < 2.5 * one.tokens  # half the bytes per token, and more room left


def test_a_model_too_big_for_one_gpu_is_a_one_line_error_suggesting_tp(tmp_path):
    with pytest.raises(ConfigError, match=r"backend.tensor_parallel_size=1 .* try backend.tensor_parallel_size=2"):
        build(compose_config(*ROOFLINE, "backend.model=llama-3-70b"))
    fits = build(compose_config(*ROOFLINE, "backend.model=llama-3-70b", "backend.tensor_parallel_size=4"))
    assert fits.kv_budget.tokens > 100_000
    proc = call_cli(tmp_path, *ROOFLINE, "backend.model=llama-3-70b")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "backend.tensor_parallel_size=2" in line


def test_explicit_num_blocks_wins_and_unknown_hardware_keeps_max_batch_sequences():
    explicit = build(compose_config(*ROOFLINE, "num_blocks=100", "workload.num_requests=2"))
    assert explicit.engine.allocator.layout.num_blocks == 100 and explicit.kv_budget is None
    for overrides in (("backend=sim",), ("backend=sim", "backend.cost_model=roofline", "backend.hardware=cpu")):
        bench = build(compose_config(*overrides, "max_batch=8", "max_model_len=512", "workload.num_requests=2"))
        assert bench.kv_budget is None and bench.engine.allocator.layout.num_blocks == 8 * 512 // 16


def test_the_run_logs_its_capacity(tmp_path):
    cfg = compose_config(*ROOFLINE, "workload.num_requests=4", "backend.tensor_parallel_size=2")
    outcome = run_job(cfg, tmp_path)
    assert outcome.status == "finished"
    s = json.loads((tmp_path / "summary.json").read_text())
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert s["kv_capacity_tokens"] == s["kv_capacity_blocks"] * 16 == info["kv_layout"]["num_blocks"] * 16
    assert info["kv_layout"]["sized_from"]["kv_capacity_tokens"] // 16 == s["kv_capacity_blocks"]
    assert s["num_gpus"] == 2 and s["output_throughput_per_gpu"] == pytest.approx(s["output_throughput"] / 2)


def _batch1_itl_ms(model: str, tp: int, run_dir) -> float:
    """Median ITL of requests 5 s apart, each done in well under a second: batch 1 throughout."""
    cfg = compose_config(
        *ROOFLINE, f"backend.model={model}", f"backend.tensor_parallel_size={tp}", "workload=uniform",
        "workload.num_requests=3", "workload.rate=0.2", "workload.output_len.value=32",
    )  # fmt: skip
    outcome = run_job(cfg, run_dir / f"{model}-{tp}")
    assert outcome.status == "finished" and outcome.summary["completed"] == 3
    return outcome.summary["median_itl_ms"]


def test_tp2_cuts_batch1_itl_of_a_bandwidth_bound_model_by_less_than_half(tmp_path):
    one, two = _batch1_itl_ms("llama-3-8b", 1, tmp_path), _batch1_itl_ms("llama-3-8b", 2, tmp_path)
    assert 0.5 * one < two < 0.9 * one
    small_one, small_two = _batch1_itl_ms("llama-3.2-1b", 1, tmp_path), _batch1_itl_ms("llama-3.2-1b", 2, tmp_path)
    assert small_two / small_one > two / one and small_two > 0.85 * small_one  # a small model: TP buys little


def test_allreduces_are_costed_on_the_link():
    model = PRESETS["llama-3-8b"]
    nvlink = RooflineCost(model, HARDWARE["h100"], "bfloat16", tp=8)
    pcie = RooflineCost(model, HARDWARE["h100"], "bfloat16", tp=8, interconnect="pcie4")
    assert nvlink.link == LINKS["nvlink4"]
    # a ring all-reduce moves 2(N-1)/N of the bytes through each link in 2(N-1) latency steps
    link = LINKS["pcie4"]
    assert link.allreduce_seconds(8e6, 8) == pytest.approx(14 * link.latency + 14 / 8 * 8e6 / link.bandwidth)
    assert link.allreduce_seconds(8e6, 1) == 0
    w = StepWork(64, 1e12, 2e9, 1e9, 1e8, 0.0, 2 * model.num_layers, 64 * 4096 * 2)
    nbytes = w.allreduce_bytes
    per_allreduce = link.allreduce_seconds(nbytes, 8) - LINKS["nvlink4"].allreduce_seconds(nbytes, 8)
    assert pcie.seconds(w) - nvlink.seconds(w) == pytest.approx(64 * per_allreduce)


def test_shards_split_heads_and_replicate_kv_heads_past_their_count():
    model = PRESETS["llama-3-8b"]  # 32 heads, 8 KV heads
    s4, s16 = tp_shard(model, 4), TPShard(model, 16)
    assert (s4.num_heads, s4.num_kv_heads, s4.intermediate_size) == (8, 2, 3584)
    assert [s4.kv_head_start(r) for r in range(4)] == [0, 2, 4, 6]
    assert s16.num_kv_heads == 1 and [s16.kv_head_start(r) for r in range(4)] == [0, 0, 1, 1]
    for bad in (3, 5, 64):
        with pytest.raises(ConfigError, match="backend.tensor_parallel_size"):
            tp_shard(model, bad)
    with pytest.raises(ConfigError, match="backend.tensor_parallel_size"):
        build(compose_config("backend=sim", "backend.tensor_parallel_size=2"))  # linear: no model to split
    for bad in ("0", "1.5", "true"):
        with pytest.raises(ConfigError, match="backend.gpu_memory_utilization"):
            build(compose_config(*ROOFLINE, f"backend.gpu_memory_utilization={bad}"))


def test_the_kv_bytes_command_shows_the_arithmetic(capsys):
    from paged_bench.sizing import kv_bytes

    assert kv_bytes.main(["--model", "llama-3-8b", "--hardware", "h100"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("h100: 79.19 GiB x 0.9 = 71.27 GiB - weights 14.96 GiB")  # vLLM logs 79.19 GiB for an H100
    tokens = int(line.split(" = ")[-2].split()[0].replace(",", ""))
    assert 350_000 <= tokens <= 500_000
    assert kv_bytes.main(["--model", "llama-3-70b", "--hardware", "h100"]) == 2
    assert "try --tp 2" in capsys.readouterr().err  # the command's flag, not the config key
    assert kv_bytes.main(["--hardware", "cpu"]) == 2  # no memory figure to size from


def test_kv_bytes_per_token_counts_every_ranks_kv_heads_replicated_ones_too(tmp_path):
    """Past num_kv_heads ranks vLLM replicates KV heads: 16 ranks of llama-3-8b (8 KV heads) hold
    twice the model's K/V per token. The summary gave the model's figure, half the real total."""
    from paged_bench.run.job import run_job

    one = run_job(compose_config(*ROOFLINE, "workload.num_requests=2"), tmp_path / "one").summary
    split = run_job(compose_config(*ROOFLINE, "workload.num_requests=2", "backend.tensor_parallel_size=16"),
                    tmp_path / "split")
    assert split.summary["kv_bytes_per_token"] == 2 * one["kv_bytes_per_token"] == 2 * 131_072
    assert split.summary["kv_reserved_bytes_peak"] == split.summary["kv_reserved_slots_peak"] * 262_144


def test_every_rank_holds_the_whole_vocabularys_logits_as_vllm_gathers_them():
    from paged_bench.model.config import PRESETS
    from paged_bench.sizing.kv_capacity import activation_bytes
    from paged_bench.sizing.tp_shard import TPShard

    model = PRESETS["llama-3-8b"]
    one, eight = (activation_bytes(TPShard(model, tp), "bfloat16", 8192, 256) for tp in (1, 8))
    mlp = lambda tp: 8192 * (2 * model.hidden_size + 3 * model.intermediate_size // tp) * 2
    assert one - mlp(1) == eight - mlp(8) == 256 * model.vocab_size * 4


def test_a_pool_too_small_for_one_sequence_names_what_to_change():
    """It named num_blocks (never set: auto) or said num_blocks=0; vLLM says to raise
    gpu_memory_utilization or lower max_model_len."""
    with pytest.raises(ConfigError) as e:
        build(compose_config(*ROOFLINE, "backend.model=llama-3-70b", "backend.tensor_parallel_size=2",
                             "backend.gpu_memory_utilization=0.85", "max_model_len=8192"))  # fmt: skip
    assert str(e.value).startswith("max_model_len=8192 is not allowed: at most 1,232: what the KV memory left on h100 "
                                   "at backend.gpu_memory_utilization=0.85 holds; raise it, lower max_model_len")  # fmt: skip
    # a pool the config sizes itself names num_blocks
    with pytest.raises(ConfigError, match="^num_blocks=10 is not allowed: a pool that holds one max_model_len=512 "
                                          "sequence \\(now 10 blocks x 16 = 160 slots\\)"):  # fmt: skip
        build(compose_config("backend=sim", "num_blocks=10"))
