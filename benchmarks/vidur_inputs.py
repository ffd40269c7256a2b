"""What Vidur's profiled matmuls multiplied, and whether it matters to the measured cost model.

Vidur timed each layer (vidur/profiling/mlp/mlp_impl.py at microsoft/vidur e26eb8f) with
sarathi's ``initialize_dummy_weights`` (every parameter, norm weights included, uniform in
[-1e-3, 1e-3]), in float16, on random token ids, with ``torch.randn`` standing in for the
attention output. On such weights the gate/up matmul's outputs are about 2e-5, under float16's
smallest normal number, and SiLU(gate) x up (about 1e-10) rounds to zero: the down projection was
timed on an all-zero input. A matmul on zeros can run faster than on real data on a GPU held at
its power limit (H. He, "Strangely, Matrix Multiplications on GPUs Run Faster When Given
'Predictable' Data!", thonking.ai, 2024: 295 against 257 TFLOP/s on A100 for zeros against
randn). This script

1. replays that layer's forward in numpy for every profiled model with a gated MLP (float32
   sums rounded to float16 after each operation, as cuBLAS and vLLM's kernels write them) and
   prints the share of zero and subnormal values entering each matmul;
2. compares, per GPU, the down projection's FLOP rate with the gate/up projection's in the
   profiles (median over models and TP degrees, 1,024 tokens and more);
3. refits each GPU's matmul surface without the down projection's rows and prints how much a
   Llama 3 8B layer's matmuls move.

    .venv/bin/python benchmarks/vidur_inputs.py [--models Llama-2-7b-hf,Meta-Llama-3-8B]

Its figures are in docs/costmodel.md ("What the profiles multiplied").
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from paged_bench.costmodel.measured.gemm import fit_surface
from paged_bench.costmodel.measured.profiles import ProfiledModel, gemm_dims, gemm_rows, kernel_rows, models
from paged_bench.costmodel.measured.step import datasheet

F16 = np.float16
SMALLEST_NORMAL = float(np.finfo(F16).tiny)  # 6.1e-5
COLUMNS = 512  # output columns computed where only the values' statistics matter


def dummy(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1e-3, 1e-3, shape).astype(np.float32).astype(F16)


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """cuBLAS's float16 matmul: float32 sums, the result written as float16."""
    return (x.astype(np.float32) @ w.astype(np.float32).T).astype(F16)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    x32 = x.astype(np.float32)
    return (x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + eps)).astype(F16) * weight


def matmul_inputs(model: ProfiledModel, tokens: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """What each matmul of Vidur's profiled layer multiplied (mlp_impl.py's GPTBlock with a
    post-attention norm), for ``model`` at TP 1."""
    rng = np.random.default_rng(seed)
    h, d = model.hidden_size, model.head_dim
    x = dummy(rng, tokens, h)  # the embedding rows of random token ids
    hn = rms_norm(x, dummy(rng, h))
    attn = rng.standard_normal((tokens, model.num_heads * d)).astype(F16)  # torch.randn_like(q)
    hs = x + matmul(attn, dummy(rng, h, model.num_heads * d))  # the residual add
    hn2 = rms_norm(hs, dummy(rng, h))
    up = matmul(hn2, dummy(rng, 2 * COLUMNS, h))  # gate and up, COLUMNS of each
    gate, up = up[:, :COLUMNS], up[:, COLUMNS:]
    g32 = gate.astype(np.float32)
    act = (g32 / (1 + np.exp(-g32))).astype(F16) * up  # SiluAndMul
    return {"attn_pre_proj": hn, "attn_post_proj": attn, "mlp_up_proj": hn2, "mlp_down_proj": act}


def rate_ratios(gpu: str, min_tokens: int = 1024) -> tuple[float, float]:
    """Median over rows of (down / gate-up) and (O / gate-up) FLOP rates, gated models only."""
    down, post = [], []
    for row in kernel_rows(gpu):
        if row.num_tokens < min_tokens or not row.model.gated_mlp:
            continue
        rate = {op: n * k / row.ms[op] for op, (n, k) in gemm_dims(row.model, row.tp).items()}
        down.append(rate["mlp_down_proj"] / rate["mlp_up_proj"])
        post.append(rate["attn_post_proj"] / rate["mlp_up_proj"])
    return statistics.median(down), statistics.median(post)


def llama3_8b_matmuls(surface, tokens: int) -> float:
    """A Llama 3 8B layer's four matmuls (TP 1) on ``tokens`` rows, priced by ``surface``."""
    dims = gemm_dims(models()["Meta-Llama-3-8B"], 1).values()
    return sum(float(surface.seconds(tokens, n, k)) for n, k in dims)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(models()), help="the profiled models to replay (comma-separated)")
    names = p.parse_args().models.split(",")
    unknown = sorted(set(names) - set(models()))
    if unknown:
        p.error(f"--models: no profiled model {', '.join(unknown)} (known: {', '.join(models())})")
    print("1. each matmul's input in Vidur's profiled layer (float16, dummy weights, TP 1): zeros / subnormals\n")
    print("| model | QKV | O | gate/up | down |")
    print("|---|---:|---:|---:|---:|")
    for model in (models()[name] for name in names):
        if not model.gated_mlp:
            print(f"| {model.name} | not replayed: LayerNorm, GELU and biases (no gated MLP) | | | |")
            continue
        cells = []
        for x in matmul_inputs(model).values():
            x32 = np.abs(x.astype(np.float32))
            cells.append(f"{(x32 == 0).mean():.0%} / {((x32 > 0) & (x32 < SMALLEST_NORMAL)).mean():.0%}")
        print(f"| {model.name} | " + " | ".join(cells) + " |")
    print("\n2. FLOP rate against the gate/up matmul's in the profiles (median, gated models, >= 1,024 tokens)\n")
    print("| GPU | down (timed on zeros) | O (timed on randn) |")
    print("|---|---:|---:|")
    for gpu in ("h100", "a100", "a40"):
        down, post = rate_ratios(gpu)
        print(f"| {gpu} | {down:.2f} | {post:.2f} |")
    print("\n3. Llama 3 8B layer's matmuls on the surface fitted without the down projection's rows\n")
    print("| GPU | tokens | with (ms) | without (ms) | change |")
    print("|---|---:|---:|---:|---:|")
    for gpu in ("h100", "a100"):
        peak, bandwidth = datasheet(gpu)
        rows = gemm_rows(gpu)
        full = fit_surface(rows, peak, bandwidth)
        less = fit_surface(rows.where(rows.op != "mlp_down_proj"), peak, bandwidth)
        for tokens in (256, 1536, 8192):
            a, b = llama3_8b_matmuls(full, tokens), llama3_8b_matmuls(less, tokens)
            print(f"| {gpu} | {tokens:,} | {a * 1e3:.3f} | {b * 1e3:.3f} | {b / a - 1:+.1%} |")


if __name__ == "__main__":
    main()
