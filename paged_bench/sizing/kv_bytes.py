"""The KV-cache byte estimate: layers x KV heads x head_dim x bytes x 2 (K and V) x tokens.

    python -m paged_bench.sizing.kv_bytes --model llama-3-8b --seq-len 2048
    python -m paged_bench.sizing.kv_bytes --model-path DIR --seq-len 4096 --batch 16
    python -m paged_bench.sizing.kv_bytes --model llama-3-8b --hardware h100 [--tp 2]

The same figure a run reports as ``kv_bytes_per_token`` (and, times its reserved slots,
``kv_reserved_bytes_peak``). With ``--hardware`` it also prints how many tokens of KV fit next
to the model on that device, term by term: what ``num_blocks=auto`` gives a roofline run.
The flags that only matter with ``--hardware`` are checked without it too: a typo is an
error, not a value silently ignored.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from paged_bench.costmodel.roofline import HARDWARE, RooflineCost, hardware
from paged_bench.errors import MAX_TOKENS, ConfigError, PagedBenchError, check, check_int
from paged_bench.model.config import DTYPE_BYTES, PRESETS, ModelConfig, resolve_model
from paged_bench.sizing.kv_capacity import KVBudget
from paged_bench.sizing.tp_shard import TPShard, tp_shard

# the config keys the shared model and memory code names, as this command's flags
FLAGS = {"backend.model_path": "--model-path", "backend.model": "--model", "backend.dtype": "--dtype",
         "backend.tensor_parallel_size": "--tp", "backend.gpu_memory_utilization": "--gpu-memory-utilization",
         "max_num_batched_tokens": "--max-num-batched-tokens", "max_batch": "--max-num-seqs",
         "block_size": "--block-size"}  # fmt: skip
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
    return KVEstimate(model, dt, check_int("--seq-len", seq_len, 1, MAX_TOKENS), check_int("--batch", batch))


def as_flags(e: ConfigError) -> ConfigError:
    """``e`` with the config keys it names (``backend.tensor_parallel_size``) as this command's
    flags (``--tp``): the user typed flags, and has no config to find those keys in."""
    allowed = e.allowed
    for key, flag in FLAGS.items():
        allowed = allowed.replace(f"{key}=", f"{flag} ")
    return ConfigError(FLAGS.get(e.key, e.key), e.value, allowed)


def _check_sizing_flags(args: argparse.Namespace, model: ModelConfig) -> TPShard:
    """The flags that size a pool with --hardware, checked whether or not it is given; the
    model over ``--tp`` ranks."""
    shard = tp_shard(model, args.tp)
    check(0 < args.gpu_memory_utilization <= 1, "--gpu-memory-utilization", args.gpu_memory_utilization,
          "a fraction in (0, 1]")  # fmt: skip
    check_int("--max-num-batched-tokens", args.max_num_batched_tokens, 1, MAX_TOKENS)
    check_int("--max-num-seqs", args.max_num_seqs)
    check_int("--block-size", args.block_size, 1, MAX_TOKENS)
    return shard


def _replicated(shard: TPShard, dtype: str) -> str:
    """Past one KV head per rank, heads are copied onto several ranks, and a token's K/V over
    all ranks grows: the figure a run reports as ``kv_bytes_per_token``."""
    m, total = shard.model, shard.kv_bytes_per_token_all_ranks(dtype)
    return (
        f"with --tp {shard.size}: each of the {m.num_kv_heads} KV heads is held by {shard.size // m.num_kv_heads} "
        f"ranks: {total:,} bytes/token ({_human(total)}) over all ranks, as a run reports kv_bytes_per_token"
    )


def _budget(args: argparse.Namespace, model: ModelConfig, dtype: str) -> KVBudget:
    """The KV pool on ``--hardware`` beside the model, term by term."""
    cost = RooflineCost(model, hardware(args.hardware, "--hardware"), dtype, args.tp)
    budget = cost.kv_budget(args.gpu_memory_utilization, args.max_num_batched_tokens, args.max_num_seqs)
    check(budget is not None, "--hardware", args.hardware, f"a preset with a memory figure ({', '.join(GPU_PRESETS)})")
    return budget


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paged_bench.sizing.kv_bytes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3-8b", help=f"a preset: {', '.join(PRESETS)}")
    parser.add_argument("--model-path", help="a local Hugging Face checkpoint folder (its config.json)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--dtype", help="bytes per value: float32, bfloat16, float16 (default: the model's)")
    parser.add_argument("--batch", type=int, default=1, help="sequences held at once")
    parser.add_argument("--hardware", help=f"also size the KV pool on this device preset ({', '.join(GPU_PRESETS)})")
    with_hw = "with --hardware; checked without it too"
    parser.add_argument("--tp", type=int, default=1, help=f"tensor-parallel ranks ({with_hw})")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help=f"share of the device's memory to use ({with_hw})")  # fmt: skip
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192,
                        help=f"the profile forward's tokens ({with_hw})")  # fmt: skip
    parser.add_argument("--max-num-seqs", type=int, default=256,
                        help=f"rows of the profile forward's logits ({with_hw})")  # fmt: skip
    parser.add_argument("--block-size", type=int, default=16, help=f"tokens per KV block ({with_hw})")
    args = parser.parse_args(argv)
    try:
        model = resolve_model(args.model, args.model_path, key="--model")
        est = estimate(model, args.seq_len, args.dtype, args.batch)
        shard = _check_sizing_flags(args, model)
        budget = _budget(args, model, est.dtype) if args.hardware else None
    except ConfigError as e:
        print(f"error: {as_flags(e)}", file=sys.stderr)
        return e.exit_code
    except PagedBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(est.describe(args.model_path or args.model))
    if shard.size > model.num_kv_heads:
        print(_replicated(shard, est.dtype))
    if budget is not None:
        print(budget.describe(args.block_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
