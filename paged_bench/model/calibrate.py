"""Calibrate the simulator against a real backend: time varied batch shapes, fit the roofline.

    python -m paged_bench.model.calibrate backend=numpy [--out FILE] [--hardware measure]

runs the backend (any overrides of the main command pick it and its model) over decode
batches, prefill chunks and mixed steps at several context lengths, times each step, fits
the roofline's ``overhead``, ``per_seq`` and efficiencies (least squares on relative error,
non-negative), and saves a preset that ``backend=sim backend.preset=FILE`` replays.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paged_bench.allocators.paged import PagedAllocator
from paged_bench.backends.base import Backend
from paged_bench.errors import ConfigError, PagedBenchError, check
from paged_bench.model.config import ModelConfig
from paged_bench.model.engine_cost import measure_engine_cost
from paged_bench.model.roofline import Hardware, RooflineCost, StepWork, hardware, measure_cpu, save_preset, step_work
from paged_bench.request import Request
from paged_bench.step import NewRequestData, StepPlan

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Shape:
    """One timed step: ``decodes`` sequences decoding at context ``context``, plus ``prefills``
    chunks of ``chunk`` new tokens (after ``context`` cached ones)."""

    decodes: int
    prefills: int
    chunk: int
    context: int


def default_shapes(max_len: int = 512) -> list[Shape]:
    """Decode batches, prefill chunks, and the mixed steps continuous batching runs most: a
    prompt chunk beside a batch of decodes. Chunks go up to ``max_len`` (long prompts are
    prefilled in one chunk of up to ``max_num_batched_tokens``)."""
    ctxs = [c for c in (16, 128, 384) if c < max_len]
    chunks = [n for n in (16, 64, 128, 256, 512, 1024, 2048, 4096) if n < max_len]
    shapes = [Shape(b, 0, 0, c) for b, c in itertools.product((1, 2, 4, 8, 16, 32), ctxs)]
    shapes += [Shape(0, p, n, 0) for p, n in itertools.product((1, 2, 4), chunks) if p * n <= 1024]
    shapes += [Shape(0, 1, n, c) for n, c in ((64, 128), (128, 256), (512, 512)) if n + c < max_len]
    mixed = itertools.product((1, 4, 8, 16), (32, 96, 512, 2048), (16, 128))
    shapes += [Shape(b, 1, n, c) for b, n, c in mixed if n + c < max_len and (n <= 96 or b in (1, 8))]
    return shapes


def _plan(
    shape: Shape, allocator: PagedAllocator, rng: np.random.Generator, vocab: int
) -> tuple[StepPlan, list[Request]]:
    reqs, rows = [], []
    specs = [(shape.context, 1)] * shape.decodes + [(shape.context, shape.chunk)] * shape.prefills
    for i, (ctx, n) in enumerate(specs):
        req = Request(i, 0.0, rng.integers(0, vocab, ctx + n).tolist(), 1)
        if not allocator.allocate_slots(req, ctx + n):
            raise ConfigError("calibration shape", shape, "fewer tokens than the calibration pool holds")
        req.num_computed_tokens = ctx
        reqs.append(req)
        rows.append((NewRequestData.from_request(req, allocator.block_table(req)), n))
    return StepPlan.starting(rows), reqs


def time_shapes(
    backend: Backend, model: ModelConfig, dtype: str, shapes: Sequence[Shape], repeats: int = 3
) -> list[tuple[StepWork, float]]:
    """(work, median seconds) of ``backend.execute`` for each shape, each timed after a warm-up.

    The repeats are rounds over every shape rather than back-to-back runs of one, so that a
    burst of load from elsewhere on a shared machine spreads over the shapes instead of
    skewing the few it lands on (a skewed shape bends the whole fit)."""
    need = max(s.decodes + s.prefills for s in shapes) * -(
        -max(s.context + max(s.chunk, 1) for s in shapes) // BLOCK_SIZE
    )
    allocator = PagedAllocator(num_blocks=need + 1, block_size=BLOCK_SIZE, prefix_caching=False, swap_blocks=0)
    backend.bind(allocator)
    rng = np.random.default_rng(0)
    times: list[list[float]] = [[] for _ in shapes]
    works: list[StepWork] = []
    for round_no in range(repeats):
        for i, shape in enumerate(shapes):
            plan, reqs = _plan(shape, allocator, rng, model.vocab_size)
            backend.execute(plan)  # warm-up: first-touch of this shape's K/V and buffers
            start = time.perf_counter()
            backend.execute(plan)
            times[i].append(time.perf_counter() - start)
            for req in reqs:
                allocator.free(req)
            if round_no == 0:
                works.append(step_work(plan, model, dtype, BLOCK_SIZE))
    return [(work, statistics.median(t)) for work, t in zip(works, times)]


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of columns: the best of every column subset."""
    best, best_x = float("inf"), np.zeros(a.shape[1])
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (x < 0).any():
                continue
            err = float(np.sum((a[:, cols] @ x - b) ** 2))
            if err < best:
                best, best_x = err, np.zeros(a.shape[1])
                best_x[list(cols)] = x
    return best_x


_EFFS = ("compute_eff", "memory_eff", "attn_eff", "kv_eff")


def fit(cost: RooflineCost, samples: Sequence[tuple[StepWork, float]], iterations: int = 30) -> RooflineCost:
    """Fit overhead, per_seq, the four efficiencies and per_score_byte of ``cost`` to measured
    step times.

    Each roofline is a max, so this alternates: given which side bounds each kernel class of
    each step, the time is linear in (1, sequences, and the bounding side's FLOPs/peak or
    bytes/bandwidth); solve that (non-negative, on relative error so short and long steps
    count alike); re-decide the sides with the new efficiencies; until nothing changes.
    Alternation can settle in a local optimum, so it starts from every way of bounding the
    two kernel classes (and from the preset's own efficiencies) and keeps the best fit."""
    hw = cost.hardware
    t = np.array([s for _, s in samples])
    seqs = np.array([w.num_seqs for w, _ in samples], float)
    # per kernel class: (compute seconds at peak, memory seconds at full bandwidth)
    sides = [
        (
            np.array([w.matmul_flops for w, _ in samples]) / hw.peak_flops,
            np.array([w.weight_bytes for w, _ in samples]) / hw.mem_bandwidth,
        ),
        (
            np.array([w.attn_flops for w, _ in samples]) / hw.peak_flops,
            np.array([w.kv_bytes for w, _ in samples]) / hw.mem_bandwidth,
        ),
    ]
    scores = np.array([w.score_bytes for w, _ in samples])
    prior = [1 / getattr(hw, name) for name in _EFFS]

    def decide(inv: list[float]) -> list[np.ndarray]:
        return [c * inv[2 * k] >= m * inv[2 * k + 1] for k, (c, m) in enumerate(sides)]

    def alternate(bound: list[np.ndarray]) -> RooflineCost:
        inv, x = list(prior), np.zeros(7)
        for _ in range(iterations):
            cols = [np.ones_like(t), seqs]
            for (c, m), b in zip(sides, bound):
                cols += [c * b, m * ~b]
            cols.append(scores)  # additive: score traffic comes on top of either bound
            a = np.stack(cols, axis=1) / t[:, None]
            x = _nnls(a, np.ones_like(t))
            # a side no step is bound by keeps the prior; one the fit finds free costs ~nothing
            inv = [max(x[2 + i], 1e-6) if a[:, 2 + i].any() else inv[i] for i in range(4)]
            new_bound = decide(inv)
            if all((a == b).all() for a, b in zip(new_bound, bound)):
                break
            bound = new_bound
        effs = {name: float(1 / v) for name, v in zip(_EFFS, inv)}
        return cost.with_fit(overhead=float(x[0]), per_seq=float(x[1]), per_score_byte=float(x[6]), **effs)

    ones, zeros = np.ones_like(t, bool), np.zeros_like(t, bool)
    starts = [decide(prior)] + [[a, b] for a in (ones, zeros) for b in (ones, zeros)]
    fits = [alternate(start) for start in starts]
    return min(fits, key=lambda f: sum((f.seconds(w) / s - 1) ** 2 for w, s in samples))


def fit_errors(cost: RooflineCost, samples: Sequence[tuple[StepWork, float]]) -> dict[str, float]:
    rel = np.array([cost.seconds(w) / s - 1 for w, s in samples])
    return {
        "samples": len(samples),
        "median_abs_rel_err": float(np.median(np.abs(rel))),
        "max_abs_rel_err": float(np.abs(rel).max()),
    }


def calibrate(cfg: dict[str, Any], hw: Hardware, shapes: Sequence[Shape], repeats: int) -> tuple[RooflineCost, dict]:
    """Build the configured backend, time it over ``shapes``, fit; returns the cost and fit info."""
    from paged_bench import registry

    options = dict(cfg["backend"])
    name = options.pop("name")
    backend = registry.create("backend", name, **options)
    model = getattr(backend, "model_config", None)
    check(model is not None, "backend", name, "a real model backend (numpy, torch)")
    dtype = getattr(backend, "compute_dtype", "float32")
    try:
        samples = time_shapes(backend, model, dtype, shapes, repeats)
    finally:
        backend.close()
    cost = fit(RooflineCost(model, hw, dtype), samples)
    info = {"backend": name, "backend_options": options, "fit": fit_errors(cost, samples)}
    # a real run also pays the engine's own work per step (scheduling, allocation, update),
    # which timing backend.execute alone leaves out
    engine = measure_engine_cost(repeats=repeats)
    h = cost.hardware
    cost = cost.with_fit(overhead=h.overhead + engine.per_step, per_seq=h.per_seq + engine.per_seq)
    info["engine"] = {"per_step_s": engine.per_step, "per_seq_s": engine.per_seq}
    return cost, info


def _pct(eff: float) -> str:
    # a side the fit finds costs nothing (e.g. weights that stay in cache) has a huge efficiency
    return f"{eff:.0%}" if eff < 10 else "free"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paged_bench.model.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "overrides", nargs="*", help="config overrides, as for python -m paged_bench (backend=numpy ...)"
    )
    parser.add_argument("--out", type=Path, help="preset file to write (default runs/calibration/BACKEND-MODEL.json)")
    parser.add_argument(
        "--hardware", default="measure", help="measure (this CPU, now) or a preset: cpu, a100, h100, h200"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per shape (median)")
    args = parser.parse_args(argv)
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from paged_bench.config import compose_config

    try:
        cfg = compose_config(*args.overrides)
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        hw = measure_cpu() if args.hardware == "measure" else hardware(args.hardware, "--hardware")
        shapes = default_shapes(cfg["max_model_len"])
        cost, info = calibrate(cfg, hw, shapes, args.repeats)
        model = cfg["backend"].get("model")
        out = (
            args.out
            or Path("runs/calibration") / f"{info['backend']}-{model if isinstance(model, str) else 'custom'}.json"
        )
        save_preset(out, cost, info)
    except PagedBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    h, fit_info = cost.hardware, info["fit"]
    print(
        f"calibrated {info['backend']} on {len(shapes)} shapes: overhead {h.overhead * 1e3:.2f} ms/step, "
        f"{h.per_seq * 1e6:.0f} us/seq; of {h.peak_flops / 1e9:.0f} GFLOP/s and {h.mem_bandwidth / 1e9:.1f} GB/s: "
        f"matmuls {_pct(h.compute_eff)} / {_pct(h.memory_eff)}, attention {_pct(h.attn_eff)} / {_pct(h.kv_eff)}; "
        f"median |error| "
        f"{fit_info['median_abs_rel_err']:.1%}, max {fit_info['max_abs_rel_err']:.1%}\n"
        f"wrote {out}; use it with: python -m paged_bench backend=sim backend.preset={out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
