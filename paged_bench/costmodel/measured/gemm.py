"""A GPU's matmul time surface over (M, N, K), fitted to every matmul its profiles timed.

    seconds = launch + max(bytes / bandwidth, FLOPs(M padded to the tile) / (peak x eff(M, N*K)))

``launch`` and ``bandwidth`` are fitted (least squares on relative error) to the memory-bound
rows (M <= 16: a decode's matmuls, which stream the weights); the bandwidth is capped at the
datasheet's. The compute side pays for whole 128-row tiles (the profiles step at every 128 rows:
an A100's 70B gate/up costs 1.07 ms from 136 to 256 rows, 1.57 ms from 264 to 384), at an
efficiency ``eff`` read from a table over log2(M) (half-octave knots) and log2(N x K) (the weight's
size: a TP slice's small matmul fills fewer SMs), each knot the median of what the rows near it
reached. Interpolated between knots, held at the edges, and never above 1: a step stays slower
than its FLOPs at peak and its bytes at the datasheet bandwidth.

``Waves`` (off by default) makes the compute side pay for wave quantization as well: the output
tiles, ceil(M / 128) x ceil(N / tile_n), run in waves of one tile per SM, so a GEMM whose tile count
just passes a multiple of the SM count pays (a ``share`` of) a whole extra wave (NVIDIA's "Matrix
Multiplication Background User's Guide", tile and wave quantization). Fitted on the profiles it
does not pay: ``benchmarks/measured_waves.py`` and docs/costmodel.md give the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paged_bench.costmodel.measured.profiles import GemmShapes

TILE = 128  # rows a tensor-core tile computes at once (cuBLAS's large tiles on A100/H100)
SMALL_M = 16  # rows at or below which a matmul is memory-bound on every profiled GPU
M_KNOTS = np.arange(0.0, 15.01, 0.5)  # log2(M): 1 .. 32768 rows
SIZE_STEP = 2.0  # log2(N x K) between the size knots
BYTES = 2  # bf16/fp16 operands, what the profiles ran
MEMORY_BOUND = 0.95  # a row whose bytes at the fitted bandwidth take this share of its time
# streaming multiprocessors, from the datasheets (H100 SXM5, A100, A40): one tile per SM a wave
SMS = {"h100": 132, "a100": 108, "a40": 84}


def gemm_flops(m: np.ndarray | float, n: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
    return 2.0 * np.asarray(m, float) * n * k


def gemm_bytes(m: np.ndarray | float, n: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
    """Weights, input and output, each once."""
    m = np.asarray(m, float)
    return BYTES * (n * k + m * k + m * n)


def _padded(m: np.ndarray) -> np.ndarray:
    """Rows the compute side pays for: whole tiles past half a tile (fewer rows run on a
    matrix-vector or small-tile kernel that pays for what it has)."""
    return np.where(m > TILE // 2, np.ceil(m / TILE) * TILE, m)


@dataclass(frozen=True)
class Waves:
    """Wave quantization: a GEMM pays ``(1 - share) x tiles + share x whole waves x sms`` tiles of
    128 x ``tile_n`` (share 1: every partial wave costs a full one; 0: the tiles alone)."""

    share: float
    tile_n: int = TILE
    sms: int = 0  # the GPU's (``SMS``), set by whoever fits the surface for a GPU

    def tiles(self, m: np.ndarray, n: np.ndarray) -> np.ndarray:
        tiles = np.ceil(m / TILE) * np.ceil(n / self.tile_n)
        return (1 - self.share) * tiles + self.share * np.ceil(tiles / self.sms) * self.sms


def paid_rows(m: np.ndarray, n: np.ndarray | float, waves: Waves | None = None) -> np.ndarray:
    """Rows whose FLOPs (2 x rows x N x K) the compute side pays for: ``_padded``, or the tiles
    ``waves`` pays for, in rows (few-row matmuls pay for what they have either way)."""
    if waves is None:
        return _padded(m)
    n = np.asarray(n, float)
    return np.where(m > TILE // 2, waves.tiles(m, n) * TILE * waves.tile_n / n, m)


@dataclass(frozen=True)
class GemmSurface:
    peak_flops: float
    bandwidth: float  # fitted, bytes/s (<= the datasheet's)
    launch: float  # seconds
    size_knots: np.ndarray  # log2(N x K)
    log_eff: np.ndarray  # [M knot, size knot]: log of the reachable fraction of peak
    waves: Waves | None = None  # None: the compute side pays for whole 128-row tiles only

    def seconds(self, m: np.ndarray | float, n: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
        rows = np.maximum(np.asarray(m, float), 1.0)
        eff = np.exp(self._log_eff(np.log2(_padded(rows)), np.log2(np.asarray(n, float) * k)))
        compute = gemm_flops(paid_rows(rows, n, self.waves), n, k) / (self.peak_flops * eff)
        return self.launch + np.maximum(gemm_bytes(rows, n, k) / self.bandwidth, compute)

    def _log_eff(self, lm: np.ndarray, ls: np.ndarray) -> np.ndarray:
        """The table read bilinearly at (log2 M, log2 N*K), held at its edges."""
        mk, sk, tab = M_KNOTS, self.size_knots, self.log_eff
        lm = np.clip(lm, mk[0], mk[-1])
        ls = np.clip(ls, sk[0], sk[-1])
        i = np.clip(np.searchsorted(mk, lm) - 1, 0, len(mk) - 2)
        j = np.clip(np.searchsorted(sk, ls) - 1, 0, len(sk) - 2)
        fi = (lm - mk[i]) / (mk[i + 1] - mk[i])
        fj = (ls - sk[j]) / (sk[j + 1] - sk[j])
        return (tab[i, j] * (1 - fi) * (1 - fj) + tab[i + 1, j] * fi * (1 - fj)
                + tab[i, j + 1] * (1 - fi) * fj + tab[i + 1, j + 1] * fi * fj)  # fmt: skip


def fit_surface(rows: GemmShapes, peak_flops: float, bandwidth: float, waves: Waves | None = None) -> GemmSurface:
    """The surface of one GPU (``peak_flops``, ``bandwidth``: its datasheet's) from its rows;
    ``waves`` (its ``sms`` set): the compute side pays for wave quantization too."""
    t = rows.ms * 1e-3
    small = rows.m <= SMALL_M
    # relative least squares: t_i = launch + bytes_i / bw, each row weighted by 1 / t_i
    a = np.column_stack([np.ones(small.sum()), gemm_bytes(rows.m[small], rows.n[small], rows.k[small])])
    (launch, per_byte), *_ = np.linalg.lstsq(a / t[small, None], np.ones(small.sum()), rcond=None)
    launch, per_byte = max(float(launch), 0.0), max(float(per_byte), 1.0 / bandwidth)
    # what each row reached of peak on its padded FLOPs, in the time left after the launch; a row
    # its bytes explain (memory-bound) says only that compute was faster: it sets no knot, so
    # the memory side (what a faster memory speeds up: h200) prices it
    left = np.maximum(t - launch, 1e-9)
    eff = gemm_flops(paid_rows(rows.m, rows.n, waves), rows.n, rows.k) / (peak_flops * left)
    eff[gemm_bytes(rows.m, rows.n, rows.k) * per_byte >= MEMORY_BOUND * left] = np.nan
    # nor does a row of a few tokens (a matrix-vector kernel: its bytes and launch price it)
    eff[rows.m <= TILE // 2] = np.nan
    lm, ls = np.log2(_padded(rows.m)), np.log2(rows.n * rows.k)
    sk = np.arange(np.floor(ls.min()), np.ceil(ls.max()) + SIZE_STEP, SIZE_STEP)
    tab = np.full((len(M_KNOTS), len(sk)), np.nan)
    near_m = np.abs(lm[None, :] - M_KNOTS[:, None]) < 0.25
    near_s = np.abs(ls[None, :] - sk[:, None]) < SIZE_STEP / 2
    for i in range(len(M_KNOTS)):
        for j in range(len(sk)):
            sel = near_m[i] & near_s[j] & ~np.isnan(eff)
            if sel.any():
                tab[i, j] = np.log(np.median(eff[sel]))
    _fill(tab, sk)
    return GemmSurface(peak_flops, 1.0 / per_byte, launch, sk, np.minimum(tab, 0.0), waves)


def _fill(tab: np.ndarray, sk: np.ndarray) -> None:
    """Knots no row came near: interpolated along the size axis, then along M (held at the ends)."""
    for row in tab:
        ok = ~np.isnan(row)
        if ok.any():
            row[:] = np.interp(sk, sk[ok], row[ok])
    for j in range(tab.shape[1]):
        ok = ~np.isnan(tab[:, j])
        if ok.any():
            tab[:, j] = np.interp(M_KNOTS, M_KNOTS[ok], tab[ok, j])
    tab[np.isnan(tab)] = 0.0  # a knot no row informs on either axis: peak (the memory side prices it)
