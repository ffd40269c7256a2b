"""Does wave quantization explain the profiles' matmul times? The check behind docs/costmodel.md's
"Wave quantization" (issue 35: the one leave-one-out miss, Llama-2-7b on H100 at 256 tokens).

A GEMM's output tiles run in waves of one tile per SM (132 on H100 SXM, 108 on A100), so a GEMM
whose tile count just passes a multiple of the SM count pays a whole extra wave (NVIDIA's "Matrix
Multiplication Background User's Guide", tile and wave quantization). Prints, from the kernel
profiles only:

1. Llama-2-7b's gate/up matmul on H100 (22016 x 4096) around 256 rows beside its wave count under
   each common tile shape: no fixed tile has more waves at 256 rows than at 264, yet 256 is slower.
2. Per GPU, each (model, N, K) series of compute rows (128 <= M <= 4096) fitted alone as
   ``a + b x paid FLOPs``: the median residual with the tiles alone (the surface today) and with
   waves; the time step at each 128-row boundary where a new wave starts and where none does; how
   many rows are slower than a row with up to 128 more (a kernel pick no function rising in M has).
3. Leave-one-out (``measured_loo.py``'s check) with the surface paying for waves: TP 1 and TP 1-8.

    .venv/bin/python benchmarks/measured_waves.py [--gpu h100 a100]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import numpy as np

from paged_bench.costmodel.measured.gemm import SMS, TILE, Waves, paid_rows
from paged_bench.costmodel.measured.loo import leave_one_out
from paged_bench.costmodel.measured.profiles import gemm_rows

TILES = ((64, 128), (128, 128), (128, 256), (256, 128), (64, 256))  # (rows, columns) a CTA computes
VARIANTS = {"tiles only (today)": None, "waves 128x128, share 0.25": Waves(0.25), "waves 128x128, share 0.5": Waves(0.5),
            "waves 128x128, share 1": Waves(1.0), "waves 128x256, share 1": Waves(1.0, 256)}  # fmt: skip


def series(gpu: str, lo: int = 128, hi: int = 4096) -> Iterator[tuple[float, float, np.ndarray, np.ndarray]]:
    """(N, K, rows M, median ms at each M) of each (model, N, K) matmul on ``gpu``, lo <= M <= hi."""
    r = gemm_rows(gpu)
    for name, n, k in sorted(set(zip(r.model, r.n, r.k))):
        sel = (r.model == name) & (r.n == n) & (r.k == k) & (r.m >= lo) & (r.m <= hi)
        m = np.unique(r.m[sel])
        yield n, k, m, np.array([np.median(r.ms[sel & (r.m == x)]) for x in m])


def waves_of(m: float, n: float, tile: tuple[int, int], sms: int) -> int:
    return int(np.ceil(np.ceil(m / tile[0]) * np.ceil(n / tile[1]) / sms))


def the_miss() -> None:
    n, m, ms = next((n, m, ms) for n, k, m, ms in series("h100", 120, 400) if (n, k) == (22016, 4096))
    print(f"1. Llama-2-7b gate/up on H100 (N {n:.0f}, K 4096): ms, and waves of {SMS['h100']} tiles per tile shape")
    print(f"   {'M':>4} {'ms':>6}  " + "  ".join(f"{a}x{b}" for a, b in TILES))
    for row, t in zip(m, ms):
        if row % 64 in (0, 8):
            print(
                f"   {row:4.0f} {t:6.3f}  "
                + "  ".join(f"{waves_of(row, n, s, SMS['h100']):>{len(f'{s[0]}x{s[1]}')}}" for s in TILES)
            )
    t = dict(zip(m, ms))
    fewer = all(waves_of(256, n, s, SMS["h100"]) <= waves_of(264, n, s, SMS["h100"]) for s in TILES)
    print(
        f"   t(256) / t(264) = {t[256] / t[264]:.2f}; every tile shape has at most as many waves at 256 rows "
        f"as at 264: {fewer}"
    )


def structure(gpu: str) -> None:
    sms = SMS[gpu]
    print(f"2. {gpu}: each series fitted alone as a + b x paid FLOPs (median |residual|, share within 5%)")
    for label, waves in VARIANTS.items():
        w = None if waves is None else Waves(waves.share, waves.tile_n, sms)
        res = []
        for n, _, m, ms in series(gpu):
            work = paid_rows(m, n, w)
            coef, *_ = np.linalg.lstsq(
                np.column_stack([np.ones_like(work), work]) / ms[:, None], np.ones_like(ms), rcond=None
            )
            res += list(np.abs((coef[0] + coef[1] * work) / ms - 1))
        print(f"   {label:26} {np.median(res):5.1%}  {np.mean(np.array(res) <= 0.05):4.0%}")
    steps: dict[bool, list[float]] = {True: [], False: []}
    slower = total = 0
    for n, _, m, ms in series(gpu):
        for i in range(1, len(m)):
            a, b = m[i - 1], m[i]
            if b - a <= 8 and np.ceil(b / TILE) > np.ceil(a / TILE):  # a new 128-row tile
                new_wave = waves_of(b, n, (TILE, TILE), sms) > waves_of(a, n, (TILE, TILE), sms)
                steps[new_wave].append(ms[i] / ms[i - 1] / (np.ceil(b / TILE) / np.ceil(a / TILE)))
        for i, row in enumerate(m):
            later = ms[(m > row) & (m <= row + TILE)]
            total += len(later) > 0
            slower += len(later) > 0 and ms[i] > 1.10 * later.min()
    print(f"   at a new 128-row tile, time step / tile step: {np.median(steps[True]):.2f} where a 128x128 wave starts "
          f"({len(steps[True])}), {np.median(steps[False]):.2f} where none does ({len(steps[False])})")  # fmt: skip
    print(f"   rows slower by >10% than a row with up to 128 more rows: {slower} of {total} ({slower / total:.0%})")


def loo(gpus: list[str]) -> None:
    print("3. leave one out: median |error|, share within 10%, worst (TP 1 | TP 1-8); Llama-2-7b h100 TP1 256 tokens")
    for label, waves in VARIANTS.items():
        for gpu in gpus:
            cases = list(leave_one_out(gpu, waves=waves))
            cells = []
            for tps in ({1}, {c.tp for c in cases}):
                errs = np.array([abs(p.error) for c in cases if c.tp in tps for p in c.points])
                cells.append(f"{np.median(errs):4.1%} {np.mean(errs <= 0.10):4.0%} {errs.max():5.1%}")
            l7 = [
                p.error for c in cases if (c.model, c.tp) == ("Llama-2-7b-hf", 1) for p in c.points if p.tokens == 256
            ]
            print(f"   {label:26} {gpu:5} {' | '.join(cells)}  {f'{l7[0]:+.1%}' if gpu == 'h100' and l7 else ''}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", nargs="+", choices=sorted(SMS), default=["h100", "a100"])
    ap.add_argument("--no-loo", action="store_true", help="leave out the leave-one-out table (its slow part)")
    args = ap.parse_args()
    the_miss()
    for gpu in args.gpu:
        structure(gpu)
    if not args.no_loo:
        loo(args.gpu)


if __name__ == "__main__":
    main()
