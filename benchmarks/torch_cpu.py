"""The torch backend on this CPU: decode speed against the memory-bandwidth roofline, and our
engine against Hugging Face's ``generate`` loop serving the same weights.

1. Copy bandwidth, measured now (bytes read + written per second on buffers far beyond the
   caches), sets the decode bound: a decode step must stream every matmul weight once.
2. Decode tokens/s at batch 1, 8 and 32 (the real engine, ``bench-200m``: 12 layers, hidden
   1024, vocab 32000, ~200M fp32 parameters = ~0.8 GB, larger than the caches), from the
   decode-only steps, and the fraction of the roofline reached (bytes streamed per second /
   bandwidth).
3. 1 and 8 concurrent requests: our engine (continuous batching) vs ``backend=hf_generate``
   (one request at a time, as a notebook server) vs ``generate`` with a static batch of 8:
   TTFT, ITL and output tokens/s. Targets: >= 50% of the roofline at batch 1; at 8 requests,
   >= 3x the one-at-a-time loop's tokens/s and more than the static batch's.

    .venv/bin/python benchmarks/torch_cpu.py [--threads N] [--model bench-200m] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import torch

from paged_bench.model.config import DTYPE_BYTES, PRESETS
from paged_bench.model.hf import to_transformers
from paged_bench.model.weights import random_state
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job


def copy_bandwidth(nbytes: int = 1 << 30, seconds: float = 2.0) -> float:
    """Best (read + write) bytes/s of a torch copy between two ``nbytes`` buffers."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best


def run(*overrides: str):
    with tempfile.TemporaryDirectory() as d:
        return run_job(compose_config(*overrides, "tracking.enabled=false"), Path(d))


def workload(n: int, prompt: int, new: int) -> list[str]:
    # n requests all arriving within a millisecond: n concurrent clients
    return ["workload=uniform", f"workload.num_requests={n}", "workload.rate=100000",
            f"workload.prompt_len={prompt}", f"workload.output_len={new}"]  # fmt: skip


def decode_rate(outcome) -> tuple[float, float]:
    """(decode tokens/s, seconds per decode step) over the steps that only decoded."""
    steps = [s for s in outcome.result.steps.rows() if s.prefill_tokens == 0]
    steps = steps[len(steps) // 8 :]  # skip the first steps: warm-up
    tokens = sum(s.decode_tokens for s in steps)
    seconds = sum(s.duration for s in steps)
    return tokens / seconds, seconds / len(steps)


def static_generate(model_name: str, seed: int, batch: int, prompt: int, new: int) -> dict[str, float]:
    """``generate`` on one padded-free batch of ``batch`` equal-length prompts."""
    cfg = PRESETS[model_name]
    model = to_transformers(cfg, random_state(cfg, seed))
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(seed))
    times: list[float] = []

    class Clock:  # generate's streamer protocol; put() gets the prompt first, then each step
        def put(self, value):
            times.append(time.perf_counter())

        def end(self):
            pass

    with torch.inference_mode():
        model.generate(ids[:, :4], max_new_tokens=2, do_sample=False, eos_token_id=None, pad_token_id=0)  # warm-up
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0, streamer=Clock())
    steps = times[1:]
    itl = [b - a for a, b in itertools.pairwise(steps)]
    return {"ttft": (steps[0] - t0) * 1e3, "itl": statistics.median(itl) * 1e3, "tok_s": batch * new / (steps[-1] - t0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's, one per core)")
    p.add_argument("--model", default="bench-200m")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--part", choices=("all", "decode", "serving"), default="all", help="run one half only")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = PRESETS[args.model]
    weight_bytes = cfg.matmul_params * DTYPE_BYTES["float32"]
    bw = copy_bandwidth()
    common = ["backend=torch", f"backend.model={args.model}", "backend.device=cpu", "max_model_len=256"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; model {args.model}: "
          f"{cfg.num_params / 1e6:.0f}M params, {weight_bytes / 1e9:.2f} GB streamed per decode step; "
          f"copy bandwidth {bw / 1e9:.1f} GB/s -> batch-1 bound {bw / weight_bytes:.1f} tok/s\n")  # fmt: skip

    if args.part != "serving":
        decode_table(args, common, weight_bytes, bw)
    if args.part != "decode":
        serving_table(args)


def decode_table(args, common: list[str], weight_bytes: int, bw: float) -> None:
    cfg = PRESETS[args.model]
    print("| batch | decode tok/s | ms/step | bytes/s streamed | of roofline |\n|---|---|---|---|---|")
    for b in (int(x) for x in args.batches.split(",")):
        outcome = run(*common, "scheduler=continuous", f"max_batch={b}", *workload(b, args.prompt, args.new_tokens))
        rate, step = decode_rate(outcome)
        kv = cfg.kv_bytes_per_token("float32") * b * (args.prompt + args.new_tokens // 2)  # mean context read
        streamed = (weight_bytes + kv) / step
        print(f"| {b} | {rate:.1f} | {step * 1e3:.1f} | {streamed / 1e9:.1f} GB/s | {streamed / bw:.0%} |")


def serving_table(args) -> None:
    print("\n| concurrent | server | TTFT p50 (ms) | ITL p50 (ms) | output tok/s |\n|---|---|---|---|---|")
    rows = {}
    for c in (1, 8):
        for label, server in (("our engine", ["backend=torch", "scheduler=continuous"]),
                              ("generate, one at a time", ["backend=hf_generate", "scheduler=static"])):  # fmt: skip
            over = [*server, f"backend.model={args.model}", "backend.device=cpu", "max_model_len=256"]
            s = run(*over, f"max_batch={c if 'torch' in server[0] else 1}", *workload(c, args.prompt, args.new_tokens))
            s = s.summary
            rows[(c, label)] = s["output_throughput"]
            print(
                f"| {c} | {label} | {s['median_ttft_ms']:.0f} | {s['median_itl_ms']:.1f} | {s['output_throughput']:.1f} |"
            )
    g = static_generate(args.model, 0, 8, args.prompt, args.new_tokens)
    print(f"| 8 | generate, static batch of 8 | {g['ttft']:.0f} | {g['itl']:.1f} | {g['tok_s']:.1f} |")
    ours, loop = rows[(8, "our engine")], rows[(8, "generate, one at a time")]
    print(
        f"\nat 8 concurrent: our engine {ours / loop:.1f}x the one-at-a-time loop, {ours / g['tok_s']:.2f}x the static batch"
    )


if __name__ == "__main__":
    main()
