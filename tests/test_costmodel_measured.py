"""The measured cost model (issue 35 item 1): kernel fits that predict a profiled model they
never saw, steps that never beat the physics, and the option that runs it end to end."""

from __future__ import annotations

import numpy as np
import pytest

from paged_bench.core.plan import StepPlan
from paged_bench.costmodel.measured.attention import (
    ATTENTION_EFF,
    FA2_H100_CAUSAL_TFLOPS,
    PAGED_GQA8,
    PAGED_MHA,
    attention_seconds,
    paged_decode_share,
)
from paged_bench.costmodel.measured.collectives import CUSTOM_US, all_reduce_curves
from paged_bench.costmodel.measured.engine_cpu import engine_cpu, sampler_errors, sampler_fit
from paged_bench.costmodel.measured.gemm import SMS, Waves, paid_rows
from paged_bench.costmodel.measured.loo import leave_one_out
from paged_bench.costmodel.measured.profiles import models, read_data
from paged_bench.costmodel.measured.step import MEASURED_GPUS, measured_cost
from paged_bench.costmodel.roofline import HARDWARE, RooflineCost
from paged_bench.costmodel.step_work import step_work
from paged_bench.errors import ConfigError
from paged_bench.model.config import PRESETS, ModelConfig
from paged_bench.run.bench import build
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job

# layers of the profiled models (their profiles time one layer; the shape is the rest)
LAYERS = {"CodeLlama-34b-Instruct-hf": 48, "Llama-2-70b-hf": 80, "Llama-2-7b-hf": 32, "Meta-Llama-3-70B": 80,
          "Meta-Llama-3-8B": 32, "Qwen-72B": 80, "internlm-20b": 60, "phi-2": 32}  # fmt: skip
# the one held-out point past 10% (-14.7%): on H100, Llama-2-7b's gate/up matmul took 0.130 ms
# at 256 tokens, as long as at 512 (0.134) and 1.8x its 128-token time: cuBLAS chose a slower
# kernel for that one shape, which no surface over (M, N, K) fitted to other models can know (not
# a wave: 256 rows take 1.18x as long as 264, which run in as many waves or more under every
# common tile; docs/costmodel.md, benchmarks/measured_waves.py)
KNOWN_MISSES = {("h100", "Llama-2-7b-hf", 256)}


@pytest.mark.parametrize("gpu", ["h100", "a100"])
def test_a_held_out_model_s_layer_is_predicted_within_10_percent(gpu):
    seen = set()
    for case in leave_one_out(gpu, tps=[1]):
        assert [p.tokens for p in case.points] == [1, 16, 256, 2048]
        for p in case.points:
            key = (gpu, case.model, p.tokens)
            seen.add(key)
            if key not in KNOWN_MISSES:
                assert abs(p.error) <= 0.10, (key, p)
    assert KNOWN_MISSES & seen <= KNOWN_MISSES and len(seen) == 4 * len({m for _, m, _ in seen})


def test_wave_quantization_charges_a_partial_wave_whole_and_is_off_by_default():
    """The check behind the miss (benchmarks/measured_waves.py): Llama-2-7b's gate/up on H100 at
    256 rows is 2 x 172 tiles of 128 x 128, 2.6 waves of 132: whole waves pay for 3 x 132."""
    m, n = np.array([256.0, 264.0, 16.0]), 22016.0
    whole = paid_rows(m, n, Waves(1.0, sms=SMS["h100"]))
    assert whole[:2] * n / 128**2 == pytest.approx([3 * 132, 4 * 132]) and whole[2] == 16  # few rows: as they are
    half = paid_rows(m, n, Waves(0.5, sms=SMS["h100"]))
    assert half[0] * n / 128**2 == pytest.approx((344 + 396) / 2)
    assert list(paid_rows(m, n)) == [256, 384, 16]  # the shipped surface: whole 128-row tiles only
    shipped = measured_cost(RooflineCost(PRESETS["llama-3-8b"], HARDWARE["h100"], "bfloat16"))
    assert shipped.kernels.surface.waves is None


def _profiled(name: str) -> ModelConfig:
    m = models()[name]
    return ModelConfig(num_layers=LAYERS[name], hidden_size=m.hidden_size, num_heads=m.num_heads,
                       num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, intermediate_size=m.intermediate_size,
                       vocab_size=m.vocab_size, dtype="bfloat16")  # fmt: skip


def _plans() -> dict[str, StepPlan]:
    def plan(rows: list[tuple[int, int]], partial: frozenset[int] = frozenset()) -> StepPlan:
        starts, news = zip(*rows)
        return StepPlan(req_ids=tuple(range(len(rows))), num_computed_tokens=starts, num_new_tokens=news,
                        partial_rows=partial, num_decode_tokens=sum(n == 1 for n in news))  # fmt: skip

    return {
        "decode 1 x 128": plan([(128, 1)]),
        "decode 64 x 1024": plan([(1024, 1)] * 64),
        "decode 256 x 4000": plan([(4000, 1)] * 256),
        "prefill 1 x 2048": plan([(0, 2048)]),
        "prefill 16 x 512": plan([(0, 512)] * 16),
        "mixed 32 decodes + a 480-token chunk": plan([(700, 1)] * 32 + [(512, 480)], frozenset({32})),
    }


MODELS = {**PRESETS, **{n: _profiled(n) for n in LAYERS}}  # every preset (priced at bf16) and profiled model


@pytest.mark.parametrize("gpu", MEASURED_GPUS)
def test_no_step_beats_its_flops_at_peak_or_its_bytes_at_full_bandwidth(gpu):
    hw = HARDWARE[gpu]
    for name, model in MODELS.items():
        for tp in (1, 8) if model.num_heads % 8 == 0 and model.intermediate_size % 8 == 0 else (1,):
            cost = measured_cost(RooflineCost(model, hw, "bfloat16", tp), "none")
            for label, plan in _plans().items():
                w = step_work(plan, model, "bfloat16", 16, cost.base.shard)
                floor = max((w.matmul_flops + w.attn_flops) / hw.peak_flops,
                            (w.weight_bytes + w.kv_bytes) / hw.mem_bandwidth)  # fmt: skip
                seconds = cost.step_cost(plan, 16).gpu
                assert seconds >= floor, (gpu, name, tp, label, seconds, floor)
                if tp == 1:  # no runaway either (with TP the all-reduces add what no floor counts)
                    assert seconds <= 3 * floor + 2e-3, (gpu, name, label, seconds, floor)


def test_the_roofline_presets_keep_to_the_physics_too():
    for hw in HARDWARE.values():
        cost = RooflineCost(PRESETS["llama-3-8b"], hw, "bfloat16")
        for plan in _plans().values():
            w = step_work(plan, cost.model, "bfloat16", 16)
            floor = max(
                (w.matmul_flops + w.attn_flops) / hw.peak_flops, (w.weight_bytes + w.kv_bytes) / hw.mem_bandwidth
            )
            assert cost.seconds(w) >= floor


def test_llama_3_8b_batch_1_decode_on_h100():
    """15 GB of weights at 3.35 TB/s: a 4.5-4.8 ms floor. The measured kernels land above it:
    the matmuls stream at ~80% of the datasheet with a few microseconds' fixed time each (5.2 ms,
    as H100's 1-token matmuls in the profiles do), plus 0.6 ms of norms, rotary, activation and
    adds, 0.4 ms of LM head and 0.1 ms of attention: 6.3 ms."""
    hw = HARDWARE["h100"]
    cost = measured_cost(RooflineCost(PRESETS["llama-3-8b"], hw, "bfloat16"))
    plan = _plans()["decode 1 x 128"]
    w = step_work(plan, cost.base.model, "bfloat16", 16)
    floor = (w.weight_bytes + w.kv_bytes) / hw.mem_bandwidth
    step = cost.step_cost(plan, 16)
    assert 4.4e-3 <= floor <= 4.8e-3  # 15.0 GB of matmul weights: 4.49 ms
    assert floor < step.gpu < 1.5 * floor
    vocab = PRESETS["llama-3-8b"].vocab_size
    assert step.cpu == pytest.approx(engine_cpu("vllm_v0", vocab).seconds(1)) and 0 < step.cpu < 2e-3
    assert step.total == pytest.approx(step.gpu + step.cpu)
    h200 = measured_cost(RooflineCost(PRESETS["llama-3-8b"], HARDWARE["h200"], "bfloat16"))
    assert h200.step_cost(plan, 16).gpu < 0.8 * step.gpu  # derived: H100 kernels at 4.8 TB/s


def test_a_prompts_attention_runs_at_flashattention_2s_published_rate_for_its_length():
    """One prompt of n tokens on H100 (its causal FLOPs counted as FlashAttention's benchmark
    counts them, 4 x heads x head_dim x n^2 / 2) within 5% of the published forward rate at
    every length the figure gives: 191 TFLOP/s at 512 tokens, not the long-prompt 35% of peak."""
    hw = HARDWARE["h100"]
    cost = measured_cost(RooflineCost(PRESETS["llama-3-8b"], hw, "bfloat16"))
    model = cost.base.model
    for n, published in FA2_H100_CAUSAL_TFLOPS:
        plan = StepPlan(req_ids=(0,), num_computed_tokens=(0,), num_new_tokens=(n,), num_decode_tokens=0)
        seconds = attention_seconds(cost.attention_work(plan), ATTENTION_EFF["h100"], hw.peak_flops,
                                    hw.mem_bandwidth, launch=0.0)  # fmt: skip
        rate = 4 * model.num_heads * model.head_dim * n * n / 2 / seconds / 1e12
        assert rate == pytest.approx(published, rel=0.05), n


@pytest.mark.parametrize("gpu", ["h100", "a100"])
def test_vllms_paged_attention_runs_at_flashinfers_published_shares_by_query_group(gpu):
    """vLLM 0.2.6's PagedAttention v2 at 64 sequences (FlashInfer's figures): one query head a K/V
    head runs at the MHA curve, eight at the GQA curve (compute-bound: a quarter of the bandwidth
    at most), four at twice the GQA share, under the MHA curve."""
    for tokens, share in PAGED_MHA[gpu]:
        assert paged_decode_share(gpu, tokens, 1) == pytest.approx(share)
    for tokens, share in PAGED_GQA8[gpu]:
        assert paged_decode_share(gpu, tokens, 8) == pytest.approx(share)
        assert paged_decode_share(gpu, tokens, 4) == pytest.approx(min(2 * share, paged_decode_share(gpu, tokens, 1)))
    assert paged_decode_share(gpu, 8192, 8) < 0.3  # grouped heads: compute-bound at any context
    assert paged_decode_share(gpu, 1024, 1) > 0.7  # one query head a K/V head: near the bandwidth


def test_vllms_paged_attention_prices_decodes_by_the_models_query_heads_a_kv_head():
    def decode_gpu_ms(model: str, kernel: str) -> float:
        cost = measured_cost(RooflineCost(PRESETS[model], HARDWARE["a100"], "bfloat16"), "none",
                             decode_attention=kernel)  # fmt: skip
        return cost.step_cost(_plans()["decode 64 x 1024"], 16).gpu * 1e3

    gqa = decode_gpu_ms("llama-3-8b", "vllm_paged") - decode_gpu_ms("llama-3-8b", "flash")
    mha = decode_gpu_ms("llama-2-7b", "vllm_paged") - decode_gpu_ms("llama-2-7b", "flash")
    # 64 decodes of 1,024 tokens on A100: Llama 3 8B (4 query heads a K/V head) reads 8.6 GB of K/V
    # at 48% of 2.04 TB/s, not FlashAttention's 70%; Llama 2 7B (one a K/V head) 34 GB at 80%
    assert gqa == pytest.approx(8.6e9 * (1 / 0.48 - 1 / 0.70) / 2.039e12 * 1e3, rel=0.05)
    assert mha == pytest.approx(34.4e9 * (1 / 0.80 - 1 / 0.70) / 2.039e12 * 1e3, rel=0.05)
    with pytest.raises(ConfigError, match="backend.decode_attention"):
        measured_cost(RooflineCost(PRESETS["llama-3-8b"], HARDWARE["a100"], "bfloat16"), decode_attention="paged")


@pytest.mark.parametrize("gpu", ["h100", "a100"])
def test_all_reduce_follows_the_measured_curve(gpu):
    measured = [(int(r["ranks"]), float(r["bytes"]), float(r["ms"]) * 1e-3) for r in read_data("all_reduce.csv.gz")
                if r["gpu"] == gpu and float(r["bytes"]) >= 16e6]  # fmt: skip
    curves = all_reduce_curves(gpu)
    assert set(curves) == {2, 4, 8}
    errors = [curves[n].seconds(b) / t - 1 for n, b, t in measured]
    assert np.median(np.abs(errors)) < 0.15


def test_measured_runs_end_to_end_and_the_engine_cpu_is_its_own_figure(tmp_path):
    def run(*extra):
        cfg = compose_config("backend=sim", "backend.cost_model=measured", "tracking.enabled=false",
                             "workload.num_requests=12", *extra)  # fmt: skip
        outcome = run_job(cfg, tmp_path / "-".join(extra or ("default",)))
        assert outcome.status == "finished" and outcome.summary["completed"] == 12
        return outcome.summary

    backend = build(
        compose_config("backend=sim", "backend.cost_model=measured", "tracking.enabled=false")
    ).engine.backend
    assert backend.measured is not None and backend.roofline is not None  # the roofline sizes the pool
    with_cpu, without = run(), run("backend.engine_cpu=none")
    assert without["median_itl_ms"] < with_cpu["median_itl_ms"]


def _all_reduce(gpu: str, tp: int, nbytes: float, choice: str = "vllm_custom") -> float:
    cost = measured_cost(RooflineCost(PRESETS["llama-3-70b"], HARDWARE[gpu], "bfloat16", tp), "none", choice)
    return cost.all_reduce_seconds(nbytes)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_vllms_own_all_reduce_prices_small_messages_and_nccl_the_rest(tp):
    nccl = all_reduce_curves("h100")[tp].seconds
    # 32 KB (2 decodes of Llama-3-70B): the custom kernel's published time, well under NCCL's fit
    assert _all_reduce("h100", tp, 32768) == pytest.approx(CUSTOM_US["h100"][tp][2] * 1e-6)
    assert _all_reduce("h100", tp, 32768) < 0.7 * nccl(32768)
    assert _all_reduce("h100", tp, 100_000) < _all_reduce("h100", tp, 200_000) < nccl(200_000)  # interpolated
    assert _all_reduce("h100", tp, 1 << 20) == pytest.approx(min(nccl(1 << 20), CUSTOM_US["h100"][tp][-1] * 1e-6))
    assert _all_reduce("h100", tp, 4 << 20) == pytest.approx(nccl(4 << 20))  # past the timed sizes: NCCL's
    assert _all_reduce("h100", tp, 32768, "nccl") == pytest.approx(nccl(32768))  # --disable-custom-all-reduce
    assert _all_reduce("h200", tp, 32768) == _all_reduce("h100", tp, 32768)  # H100's NVLink and timings
    assert _all_reduce("a100", tp, 32768) == pytest.approx(all_reduce_curves("a100")[tp].seconds(32768))  # not timed


def test_the_custom_all_reduce_shortens_a_tensor_parallel_run_and_only_that(tmp_path):
    def tpot(model, tp, choice):
        cfg = compose_config("backend=sim", "backend.cost_model=measured", "tracking.enabled=false",
                             f"backend.model={model}", f"backend.tensor_parallel_size={tp}",
                             f"backend.all_reduce={choice}", "workload.num_requests=12")  # fmt: skip
        outcome = run_job(cfg, tmp_path / f"{model}-{tp}-{choice}")
        assert outcome.status == "finished" and outcome.summary["completed"] == 12
        return outcome.summary["median_tpot_ms"]

    assert tpot("llama-3-70b", 4, "vllm_custom") < 0.95 * tpot("llama-3-70b", 4, "nccl")  # 160 a step, ~20 us less each
    assert tpot("llama-3-8b", 1, "vllm_custom") == tpot("llama-3-8b", 1, "nccl")  # no all-reduce at TP 1


def test_the_sampler_is_priced_by_the_served_models_vocabulary():
    """Vidur's sampler_e2e grows with the vocabulary (Qwen-72B's 152k tokens cost twice Llama-2's
    32k at 64 sequences): fitted over batch size and vocabulary, each profiled model's sampler
    comes within a median 12%, and still within 20% with that model left out of the fit (each
    model's figures: benchmarks/measured_figures.py)."""
    rows = read_data("engine_cpu.csv")
    vocab = {name: m.vocab_size for name, m in models().items()}

    names = {r["model"] for r in rows}
    assert len(names) == 6 and len({vocab[n.split("/")[-1]] for n in names}) == 4  # four vocabularies
    for name in names:
        mine = [r for r in rows if r["model"] == name]
        fitted, left_out = sampler_fit(rows, vocab), sampler_fit([r for r in rows if r["model"] != name], vocab)
        assert np.median(np.abs(sampler_errors(fitted, mine, vocab))) < 0.12, name
        assert np.median(np.abs(sampler_errors(left_out, mine, vocab))) < 0.20, name
    small, llama3 = engine_cpu("vllm_v0", 32000), engine_cpu("vllm_v0", PRESETS["llama-3-8b"].vocab_size)
    assert llama3.each_step_seconds(64) > 1.3 * small.each_step_seconds(64)
    # the rest of the engine's CPU work does not depend on the vocabulary
    assert llama3.seconds(64) - llama3.each_step_seconds(64) == pytest.approx(
        small.seconds(64) - small.each_step_seconds(64)
    )
