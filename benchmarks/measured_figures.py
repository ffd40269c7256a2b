"""The measured cost model's figures quoted in docs/costmodel.md (issue 35).

Prints each GPU's fitted matmul bandwidth and launch time and its all-reduce curves (NCCL's, and
vLLM's own kernel as timed on H100 for small messages), then the
step table: a step's physics floor (FLOPs at peak or bytes at the datasheet bandwidth, whichever
is longer), the shipped roofline preset's price, the measured kernels' GPU time and vLLM v0's
engine CPU (``backend.engine_cpu=vllm_v0``) with its sampler's share (what a multi-step window's
later steps pay); then the engine CPU's sampler fitted by batch size
and vocabulary against each profiled model (``engine_cpu.sampler_fit``): its measured sampler at
64 sequences and the fit's median error with the model in, left out, and pooled over the models
by batch size alone (as it was priced until 2026-12-07).

    .venv/bin/python benchmarks/measured_figures.py
"""

from __future__ import annotations

import numpy as np

from paged_bench.core.plan import StepPlan
from paged_bench.costmodel.measured.collectives import CUSTOM_US, all_reduce_curves, custom_all_reduce_seconds
from paged_bench.costmodel.measured.engine_cpu import engine_cpu, sampler_errors, sampler_fit
from paged_bench.costmodel.measured.profiles import models, read_data
from paged_bench.costmodel.measured.step import kernels, measured_cost
from paged_bench.costmodel.roofline import HARDWARE, RooflineCost
from paged_bench.costmodel.step_work import step_work
from paged_bench.model.config import PRESETS

# (model, GPU, TP, label, (context, new tokens) per row)
STEPS = (
    ("llama-3-8b", "h100", 1, "decode 1 x ctx 128", [(128, 1)]),
    ("llama-3-8b", "h100", 1, "decode 64 x ctx 1024", [(1024, 1)] * 64),
    ("llama-3-8b", "h100", 1, "prefill 1 x 2048", [(0, 2048)]),
    ("llama-3-8b", "h100", 1, "prefill 8 x 215", [(0, 215)] * 8),  # a prompt step of Lambda's H100 8B run
    ("llama-3-70b", "h100", 4, "decode 1 x ctx 128", [(128, 1)]),
    ("llama-3-70b", "h100", 4, "prefill 1 x 2048", [(0, 2048)]),
    ("llama-3-8b", "h200", 1, "decode 1 x ctx 128", [(128, 1)]),
    ("llama-3-8b", "a100", 1, "decode 1 x ctx 128", [(128, 1)]),
    ("llama-3-8b", "a100", 1, "prefill 1 x 2048", [(0, 2048)]),
)


def plan(rows: list[tuple[int, int]]) -> StepPlan:
    starts, news = zip(*rows)
    return StepPlan(req_ids=tuple(range(len(rows))), num_computed_tokens=starts, num_new_tokens=news,
                    num_decode_tokens=sum(n == 1 for n in news))  # fmt: skip


def main() -> None:
    print("fitted kernels (Vidur's profiles):")
    for gpu in ("h100", "a100", "a40"):
        s = kernels(gpu).surface
        line = f"  {gpu}: matmuls stream at {s.bandwidth / 1e12:.2f} TB/s, {s.launch * 1e6:.1f} us launch"
        curves = all_reduce_curves(gpu)
        if curves:
            lat = [c.latency * 1e6 for c in curves.values()]
            bw = [c.bandwidth / 1e9 for c in curves.values()]
            at_1mb = ", ".join(f"{r} ranks {curves[r].seconds(1 << 20) * 1e6:.0f} us" for r in sorted(curves))
            line += (f"; all-reduce {min(lat):.0f}-{max(lat):.0f} us + bytes at {min(bw):.0f}-{max(bw):.0f} GB/s "
                     f"({min(curves)}-{max(curves)} ranks; of 1 MB: {at_1mb})")  # fmt: skip
        print(line)
    token = PRESETS["llama-3-70b"].hidden_size * 2  # one token's activations, bf16
    for tp, us in CUSTOM_US["h100"].items():
        nccl = all_reduce_curves("h100")[tp].seconds
        cheaper = max(
            n for n in range(1, 65) if (custom_all_reduce_seconds("h100", tp, n * token) or 1.0) < nccl(n * token)
        )
        print(f"  h100 TP{tp}, all_reduce=vllm_custom: {us[2]:.1f} us at 32 KB (NCCL's curve {nccl(32768) * 1e6:.1f}), "
              f"{us[-1]:.1f} at 1 MB ({nccl(1 << 20) * 1e6:.1f}); the cheaper up to {cheaper} tokens of Llama-3-70B "
              f"({cheaper * token / 2**20:.2f} MB)")  # fmt: skip
    print("\n| model | GPU | step | floor ms | roofline ms | measured GPU ms | engine CPU ms | of it the sampler |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name, gpu, tp, label, rows in STEPS:
        hw, model, p = HARDWARE[gpu], PRESETS[name], plan(rows)
        roofline = RooflineCost(model, hw, "bfloat16", tp)
        w = step_work(p, model, "bfloat16", 16, roofline.shard)
        floor = max((w.matmul_flops + w.attn_flops) / hw.peak_flops, (w.weight_bytes + w.kv_bytes) / hw.mem_bandwidth)
        step = measured_cost(roofline).step_cost(p, 16)
        print(f"| {name} | {gpu} TP{tp} | {label} | {floor * 1e3:.2f} | {roofline.duration(p, 16) * 1e3:.2f} "
              f"| {step.gpu * 1e3:.2f} | {step.cpu * 1e3:.2f} | {step.cpu_each_step * 1e3:.2f} |")  # fmt: skip
    print_sampler_fit()


def print_sampler_fit() -> None:
    rows = read_data("engine_cpu.csv")
    vocab = {name: m.vocab_size for name, m in models().items()}
    a, b, c, d = sampler_fit(rows, vocab)
    print(f"\nengine CPU (vllm_v0): the sampler {a:.3f} ms + {b:.5f} ms x batch + ({c * 1e6:.2f} + {d * 1e6:.4f} x batch) "
          "us x vocabulary / 1,000")  # fmt: skip
    for label, size in (("Llama 3", PRESETS["llama-3-8b"].vocab_size), ("Llama 2", 32000)):
        e = engine_cpu("vllm_v0", size)
        print(f"  {label} ({size:,} tokens): all {e.base * 1e3:.3f} + {e.per_seq * 1e3:.4f} x batch, the sampler "
              f"{e.each_step_base * 1e3:.3f} + {e.each_step_per_seq * 1e3:.4f} x batch, the rest "
              f"{(e.base - e.each_step_base) * 1e3:.3f} + {(e.per_seq - e.each_step_per_seq) * 1e3:.4f} x batch")  # fmt: skip
    pooled = {name: 0 for name in vocab}  # the pooled line: the same fit, the vocabulary taken as nil
    print("\n| profiled model | vocabulary | sampler at 64 sequences (ms) | median error: fitted | left out | pooled |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in sorted({r["model"] for r in rows}, key=lambda n: vocab[n.split("/")[-1]]):
        short = name.split("/")[-1]
        mine, others = [r for r in rows if r["model"] == name], [r for r in rows if r["model"] != name]
        at_64 = next(float(r["sampler_e2e"]) for r in mine if int(r["batch_size"]) == 64)
        medians = [float(np.median(np.abs(sampler_errors(fit, mine, table))))
                   for fit, table in ((sampler_fit(rows, vocab), vocab), (sampler_fit(others, vocab), vocab),
                                      (sampler_fit(rows, pooled), pooled))]  # fmt: skip
        cells = " | ".join(f"{m:.1%}" for m in medians)
        print(f"| {short} | {vocab[short]:,} | {at_64:.2f} | {cells} |")


if __name__ == "__main__":
    main()
