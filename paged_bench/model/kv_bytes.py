"""The KV-cache byte estimate: layers x KV heads x head_dim x bytes x 2 (K and V) x tokens.

    python -m paged_bench.model.kv_bytes --model llama-3-8b --seq-len 2048
    python -m paged_bench.model.kv_bytes --model-path DIR --seq-len 4096 --batch 16
    python -m paged_bench.model.kv_bytes --model llama-3-8b --hardware h100 [--tp 2]

The same figure a run reports as ``kv_bytes_per_token`` (and, times its reserved slots,
``kv_reserved_bytes_peak``). With ``--hardware`` it also prints how many tokens of KV fit next
to the model on that device, term by term: what ``num_blocks=auto`` gives a roofline run.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from paged_bench.errors import PagedBenchError, check, check_int
from paged_bench.model.config import DTYPE_BYTES, PRESETS, ModelConfig, resolve_model
from paged_bench.model.roofline import HARDWARE, RooflineCost, hardware

GPU_PRESETS = [name for name, hw in HARDWARE.items() if hw.memory_bytes is not None]  # those with a memory figure


@dataclass(frozen=True)
class KVEstimate:
    model: ModelConfig
    dtype: str
    seq_len: int
    batch: int

    @property
    def bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.dtype)

    @property
    def bytes_per_sequence(self) -> int:
        return self.bytes_per_token * self.seq_len

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_sequence * self.batch

    def describe(self, name: str) -> str:
        m = self.model
        return (
            f"{name}: {m.num_layers} layers x {m.num_kv_heads} KV heads x {m.head_dim} head_dim x "
            f"{DTYPE_BYTES[self.dtype]} bytes ({self.dtype}) x 2 (K and V) = {self.bytes_per_token:,} bytes/token "
            f"({_human(self.bytes_per_token)})\n"
            f"  x {self.seq_len:,} tokens = {self.bytes_per_sequence:,} bytes ({_human(self.bytes_per_sequence)}) "
            f"per sequence" + (f"; x {self.batch} sequences = {_human(self.total_bytes)}" if self.batch > 1 else "")
        )


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def estimate(model: ModelConfig, seq_len: int, dtype: str | None = None, batch: int = 1) -> KVEstimate:
    dt = dtype or model.dtype
    check(dt in DTYPE_BYTES, "--dtype", dt, ", ".join(DTYPE_BYTES))
    return KVEstimate(model, dt, check_int("--seq-len", seq_len), check_int("--batch", batch))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paged_bench.model.kv_bytes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3-8b", help=f"a preset: {', '.join(PRESETS)}")
    parser.add_argument("--model-path", help="a local Hugging Face checkpoint folder (its config.json)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--dtype", help="bytes per value: float32, bfloat16, float16 (default: the model's)")
    parser.add_argument("--batch", type=int, default=1, help="sequences held at once")
    parser.add_argument("--hardware", help=f"also size the KV pool on this device preset ({', '.join(GPU_PRESETS)})")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (with --hardware)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192, help="the profile forward's tokens")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="rows of the profile forward's logits")
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args(argv)
    try:
        model = resolve_model(args.model, args.model_path, key="--model")
        est = estimate(model, args.seq_len, args.dtype, args.batch)
        budget = None
        if args.hardware:
            cost = RooflineCost(model, hardware(args.hardware, "--hardware"), est.dtype, check_int("--tp", args.tp))
            check(0 < args.gpu_memory_utilization <= 1, "--gpu-memory-utilization", args.gpu_memory_utilization,
                  "a fraction in (0, 1]")  # fmt: skip
            budget = cost.kv_budget(args.gpu_memory_utilization, check_int("--max-num-batched-tokens",
                                    args.max_num_batched_tokens), check_int("--max-num-seqs", args.max_num_seqs))  # fmt: skip
            check(budget is not None, "--hardware", args.hardware, f"a preset with a memory figure ({', '.join(GPU_PRESETS)})")
        block_size = check_int("--block-size", args.block_size)
    except PagedBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(est.describe(args.model_path or args.model))
    if budget is not None:
        print(budget.describe(block_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
