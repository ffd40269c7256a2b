"""Calibrate the simulator against a real backend: time varied batch shapes, fit the roofline.

    python -m paged_bench.model.calibrate backend=numpy [--out FILE] [--hardware measure]

runs the backend (any overrides of the main command pick it and its model) over decode
batches, prefill chunks and mixed steps at several context lengths, times each step as a run
meets it, times the backend's own matmuls at every row count a step may have (the
``matmul_curve``: a CPU BLAS is no roofline at a few rows), fits the roofline's
``overhead``, ``per_seq``, ``per_prefill`` and attention terms to what the matmuls leave
(least squares on relative error, non-negative), and saves a preset that ``backend=sim
backend.preset=FILE`` replays. ``benchmarks/sim_vs_numpy.py --replay`` checks a preset step
by step against a real run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from paged_bench.allocators.paged import PagedAllocator
from paged_bench.backends.base import Backend
from paged_bench.errors import ConfigError, PagedBenchError, check, check_int, one_line
from paged_bench.model.calibrate_fit import _nnls, fit, fit_errors  # noqa: F401 (_nnls: the tests')
from paged_bench.model.calibrate_heap import time_heap_growth
from paged_bench.model.calibrate_run import run_check
from paged_bench.model.config import ModelConfig
from paged_bench.model.engine_cost import measure_engine_cost
from paged_bench.model.roofline import (
    HARDWARE, Hardware, RooflineCost, StepWork, hardware, measure_cpu, save_preset, step_work,
)  # fmt: skip
from paged_bench.request import Request
from paged_bench.step import NewRequestData, StepPlan

BLOCK_SIZE = 16
WARM_STEPS = 3  # untimed steps a timed one follows (decodes of the batch, or of the lead-in)
TIMED_STEPS = 3  # a decode batch's steps timed in a row, per round (their median)
# an engine with nothing to run sleeps until the next arrival (tens of ms at the seeds' 25
# req/s); the step it then starts finds its weights and code evicted from the caches by
# whatever ran meanwhile: on this 2-core VM +0.3-0.5 ms on a 3-7 ms prompt step
IDLE_SECONDS = 0.02


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
    chunks = [n for n in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if n < max_len]
    shapes = [Shape(b, 0, 0, c) for b, c in itertools.product((1, 2, 4, 8, 16, 32), ctxs)]
    shapes += [Shape(0, p, n, 0) for p, n in itertools.product((1, 2, 4), chunks) if p * n <= 1024]
    shapes += [Shape(0, 1, n, c) for n, c in ((64, 128), (128, 256), (512, 512)) if n + c < max_len]
    mixed = itertools.product((1, 4, 8, 16), (32, 96, 512, 2048), (16, 128))
    shapes += [Shape(b, 1, n, c) for b, n, c in mixed if n + c < max_len and (n <= 96 or b in (1, 8))]
    # long contexts (what long prompts leave): decodes, and chunks of a prompt after earlier
    # chunks, alone, two at once, and beside decodes (an eager attention's score matrices
    # then outgrow the caches)
    longs = [c for c in (1024, 3072) if c + 512 < max_len]
    decode_longs = [c for c in (1024, 2048, 3072) if c + 512 < max_len]
    shapes += [Shape(b, 0, 0, c) for b, c in itertools.product((1, 2, 4, 16), decode_longs)]
    # one sequence decoding at every context a long prompt leaves, densely: a long-prompt
    # workload runs little else (99% of the Azure window's steps), and with three points one
    # noisy one tilted the fitted K/V rate (the Azure median ITL 10-14% slow)
    shapes += [Shape(1, 0, 0, c) for c in (512, 768, 1280, 1536, 1792, 2560) if c + 512 < max_len]
    shapes += [Shape(b, p, 512, c) for b, p, c in itertools.product((0, 8), (1, 2), longs) if b or p == 1]
    return shapes


def _plan(
    shape: Shape, allocator: PagedAllocator, rng: np.random.Generator, vocab: int, first_id: int = 0
) -> tuple[StepPlan, list[Request]]:
    reqs, rows = [], []
    specs = [(shape.context, 1)] * shape.decodes + [(shape.context, shape.chunk)] * shape.prefills
    for i, (ctx, n) in enumerate(specs):
        req = Request(first_id + i, 0.0, rng.integers(0, vocab, ctx + n).tolist(), 1)
        if not allocator.allocate_slots(req, ctx + n):
            raise ConfigError("calibration shape", shape, "fewer tokens than the calibration pool holds")
        req.num_computed_tokens = ctx
        reqs.append(req)
        rows.append((NewRequestData.from_request(req, allocator.block_table(req)), n))
    return StepPlan.starting(rows), reqs


def _continuing(plan: StepPlan) -> StepPlan:
    """``plan`` once its decoding requests are running: a run's decode rows are requests the
    backend already holds (only a prompt's first chunk brings a new one), and setting up a
    new request's state costs what a decode step of it never pays."""
    return plan._replace(new_reqs=tuple(new for new, n in zip(plan.new_reqs, plan.num_new_tokens) if n > 1))


def time_shapes(
    backend: Backend, model: ModelConfig, dtype: str, shapes: Sequence[Shape], repeats: int = 3
) -> list[tuple[StepWork, float]]:
    """(work, seconds: ``typical_seconds`` of the repeats) of ``backend.execute`` for each shape,
    then for each ``is_idle_probe`` shape the same after an idle gap (its work ``cold``).

    The repeats are rounds over every shape rather than back-to-back runs of one, so that a
    burst of load from elsewhere on a shared machine spreads over the shapes instead of
    skewing the few it lands on (a skewed shape bends the whole fit).

    Each shape is timed as a run meets it, since that changes its cost by as much as its
    shape does: its decoding requests already running (``_continuing``), after the steps a run
    puts before it: a decode batch after ``WARM_STEPS`` of the same batch (a run decodes step
    after step: one warm step left a one-sequence decode 10% slower than in a run), then the
    median of ``TIMED_STEPS`` in a row; a step with a prompt chunk after ``WARM_STEPS`` decode
    steps (``lead_in``: prompts arrive amid decodes), not after itself (which finds its
    activations and K/V still in cache)."""
    need = (
        2
        * max(s.decodes + s.prefills for s in shapes)
        * -(-max(s.context + max(s.chunk, 1) for s in shapes) // BLOCK_SIZE)
    )
    allocator = PagedAllocator(num_blocks=need + 1, block_size=BLOCK_SIZE, prefix_caching=False, swap_blocks=0)
    backend.bind(allocator)
    rng = np.random.default_rng(0)
    times: list[list[float]] = [[] for _ in shapes]
    works: list[StepWork] = []
    idle: dict[int, list[float]] = {i: [] for i, s in enumerate(shapes) if is_idle_probe(s)}
    for round_no in range(repeats):
        for i, shape in enumerate(shapes):
            plan, reqs = _plan(shape, allocator, rng, model.vocab_size)
            backend.execute(plan)  # first touch of this shape's K/V and buffers; its requests start
            timed = _continuing(plan)
            if shape.prefills:
                lead_plan, lead_reqs = _plan(lead_in(shape), allocator, rng, model.vocab_size, len(reqs))
                backend.execute(lead_plan)
                for _ in range(WARM_STEPS - 1):
                    backend.execute(_continuing(lead_plan))
                reqs += lead_reqs
                times[i].append(_seconds(backend, timed))
                if i in idle:  # again, after the engine idled as it does waiting for arrivals
                    for _ in range(WARM_STEPS):
                        backend.execute(_continuing(lead_plan))
                    time.sleep(IDLE_SECONDS)
                    idle[i].append(_seconds(backend, timed))
            else:
                for _ in range(WARM_STEPS):
                    backend.execute(timed)
                times[i].append(float(np.median([_seconds(backend, timed) for _ in range(TIMED_STEPS)])))
            for req in reqs:
                allocator.free(req)
            backend.execute(StepPlan(finished_req_ids=tuple(r.request_id for r in reqs)))  # the backend lets them go
            if round_no == 0:  # timed warm, whatever its plan says (all of its requests new)
                works.append(replace(step_work(plan, model, dtype, BLOCK_SIZE), cold=False))
    warm = [(work, typical_seconds(t)) for work, t in zip(works, times)]
    return warm + [(replace(works[i], cold=True), typical_seconds(t)) for i, t in idle.items()]


def is_idle_probe(shape: Shape) -> bool:
    """Shapes also timed after an idle gap: a short prompt alone (what an idle engine starts
    with), where the cold start is a large share of the step."""
    return shape.decodes == 0 and shape.context == 0 and shape.chunk <= 128


def _seconds(backend: Backend, plan: StepPlan) -> float:
    start = time.perf_counter()
    backend.execute(plan)
    return time.perf_counter() - start


def typical_seconds(times: Sequence[float]) -> float:
    """What a step costs: the median of its timed repeats, the statistic the runs it is
    compared with report (a lower quartile, tried, predicted a quieter machine than a run's
    median steps meet: every step shape 5-20% fast)."""
    return float(np.median(times))


def lead_in(shape: Shape) -> Shape:
    """The decode step a run has just run before a step with a prompt chunk: its decodes (one
    sequence when it has none)."""
    return Shape(max(shape.decodes, 1), 0, 0, max(shape.context, 16))


def curve_points(max_tokens: int) -> list[int]:
    """Every row count up to 16 (where a BLAS's kernel edges make the cost jump about), then
    a geometric grid up to ``max_tokens``."""
    points = list(range(1, min(16, max_tokens) + 1))
    n = 16
    while n < max_tokens:
        n = min(int(n * 1.5), max_tokens)
        points.append(n)
    return points


def time_matmuls(
    backend: Backend, model: ModelConfig, max_tokens: int, repeats: int = 5
) -> tuple[tuple[float, float, float], ...]:
    """The backend's own matmuls timed at each row count of ``curve_points``: (rows, seconds
    of every layer's QKV/output/gate-up/down, seconds of the LM head), each the
    ``typical_seconds`` of ``repeats`` rounds over every row count.

    Run under the backend's thread settings (after ``bind``), on its weights, with its
    ``ops.linear``: what a step's matmuls cost on this BLAS, edge cases and all."""
    ops, w = backend.ops, backend.weights
    rng = np.random.default_rng(0)
    points = curve_points(max_tokens)
    inputs = {  # one input per distinct width, sliced to the row count
        dim: ops.asarray(rng.standard_normal((max_tokens, dim), dtype=np.float32))
        for dim in {model.hidden_size, model.q_size, model.intermediate_size}
    }
    layer_ops = [(inputs[d], m) for lw in w.layers for d, m in
                 ((model.hidden_size, lw.qkv), (model.q_size, lw.o), (model.hidden_size, lw.gate_up),
                  (model.intermediate_size, lw.down))]  # fmt: skip
    head = (inputs[model.hidden_size], w.lm_head)
    times: dict[int, list[tuple[float, float]]] = {n: [] for n in points}
    for round_no in range(repeats + 1):  # the first round warms up
        for n in points:
            # a run's decode step follows others of about its size, which left the weights
            # and the BLAS's state as it needs them: a point timed after one untimed pass,
            # right after the largest point, costs 40% more at one row than in a run (0.29
            # against 0.20 ms here). So a few untimed passes first, then several timed ones
            # (a decode batch's row counts, a millisecond or so a pass), their median
            passes = 5 if n <= 32 else 1
            for _ in range(passes):
                for x, m in layer_ops:
                    ops.linear(x[:n], m)
            for _ in range(passes):
                start = time.perf_counter()
                for x, m in layer_ops:
                    ops.linear(x[:n], m)
                mid = time.perf_counter()
                ops.linear(head[0][:n], head[1])
                if round_no:
                    times[n].append((mid - start, time.perf_counter() - mid))
    return tuple(
        (float(n), typical_seconds([t[0] for t in ts]), typical_seconds([t[1] for t in ts])) for n, ts in times.items()
    )


def calibrate(cfg: dict[str, Any], hw: Hardware, shapes: Sequence[Shape], repeats: int) -> tuple[RooflineCost, dict]:
    """Build the configured backend, time it over ``shapes``, fit; returns the cost and fit info."""
    from paged_bench import registry

    options = dict(cfg["backend"])
    name = options.pop("name")
    backend = registry.create("backend", name, **options)
    model = backend.model_config
    check(model is not None, "backend", name, "a real model backend (numpy, torch)")
    dtype = getattr(backend, "compute_dtype", "float32")
    try:
        per_score, per_growth = _heap_growth(backend, model, shapes)
        samples = time_shapes(backend, model, dtype, shapes, repeats)
        longest = max(max(s.decodes + s.prefills * s.chunk for s in shapes), 1)
        hw = replace(hw, matmul_curve=time_matmuls(backend, model, longest, max(repeats, 3)), eager_attention=True)
    finally:
        backend.close()
    cost = fit(RooflineCost(model, hw, dtype), samples)
    info = {"backend": name, "backend_options": options, "fit": fit_errors(cost, samples),
            "shapes": [{**asdict(shape), "measured_ms": t * 1e3, "fitted_ms": cost.seconds(w) * 1e3}
                       for shape, (w, t) in zip(shapes, samples)],
            "idle_shapes": [{**asdict(shape), "measured_ms": t * 1e3, "fitted_ms": cost.seconds(w) * 1e3}
                            for shape, (w, t) in zip(filter(is_idle_probe, shapes), samples[len(shapes):])]}  # fmt: skip
    # a real run also pays the engine's own work per step (scheduling, allocation, update),
    # which timing backend.execute alone leaves out
    engine = measure_engine_cost(repeats=repeats)
    h = cost.hardware
    cost = cost.with_fit(overhead=h.overhead + engine.per_step, per_seq=h.per_seq + engine.per_seq,
                         heap_bytes_per_score_byte=per_score, per_heap_growth_byte=per_growth)  # fmt: skip
    info["engine"] = {"per_step_s": engine.per_step, "per_seq_s": engine.per_seq}
    # checked where it will be used: a real run of a workload of its own, step by step
    info["run"] = run_check(cfg, cost)
    return cost, info


def _heap_growth(backend: Backend, model: ModelConfig, shapes: Sequence[Shape]) -> tuple[float, float]:
    """``calibrate_heap.time_heap_growth`` on a fresh heap (before any shape), over the longest
    prompt the shapes reach in their largest chunks (up to 512 tokens, as long prompts run)."""
    chunk = min(512, max((s.chunk for s in shapes if s.prefills), default=16))
    tokens = chunk * max(1, max(s.context + s.chunk for s in shapes) // chunk)
    allocator = PagedAllocator(num_blocks=-(-tokens // BLOCK_SIZE) + 1, block_size=BLOCK_SIZE,
                               prefix_caching=False, swap_blocks=0)  # fmt: skip
    backend.bind(allocator)
    return time_heap_growth(backend, allocator, model, tokens, chunk)


def _pct(eff: float) -> str:
    # a side the fit finds costs nothing (e.g. weights that stay in cache) has a huge efficiency
    return f"{eff:.0%}" if eff < 10 else "free"


def _model_name(backend: Mapping[str, Any]) -> str:
    """What the default preset file is named after: the checkpoint folder, the preset, or custom
    (a checkpoint's calibration once overwrote numpy-small.json: its model option still said small)."""
    if backend.get("model_path"):
        return Path(backend["model_path"]).resolve().name
    model = backend.get("model")
    return model if isinstance(model, str) else "custom"


def check_out(out: Path) -> None:
    """``--out`` can be written: not a folder, in a folder that exists or is made here (a file
    in the way of it failed only once the whole calibration had run)."""
    check(not out.is_dir(), "--out", str(out), "a file to write (this is a folder)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError("--out", str(out), f"a file in a folder that can be made ({one_line(e)})") from None
    check(os.access(out.parent, os.W_OK), "--out", str(out), f"a file in a folder this user may write ({out.parent} "
                                                             "is not)")  # fmt: skip


def _save(out: Path, cost: RooflineCost, info: dict) -> Path:
    """Write the preset to ``out``; if that fails now (a disk full, a folder removed meanwhile),
    to a temporary file instead, and say so: the calibration took minutes and is not lost."""
    try:
        save_preset(out, cost, info)
        return out
    except OSError as e:
        fd, spare = tempfile.mkstemp(prefix="calibration-", suffix=".json")
        os.close(fd)
        save_preset(Path(spare), cost, info)
        raise PagedBenchError(f"could not write --out {out} ({one_line(e)}); the preset was written to "
                              f"{spare}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paged_bench.model.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "overrides", nargs="*", help="config overrides, as for python -m paged_bench (backend=numpy ...)"
    )
    parser.add_argument("--out", type=Path, help="preset file to write (default runs/calibration/BACKEND-MODEL.json)")
    parser.add_argument(
        "--hardware", default="measure", help=f"measure (this CPU, now) or a preset: {', '.join(HARDWARE)}"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per shape (median)")
    args = parser.parse_args(argv)
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from paged_bench.__main__ import hydra_error
    from paged_bench.config import compose_config

    try:
        cfg = compose_config(*args.overrides)
    except OmegaConfBaseException as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except (HydraException, ValueError, TypeError) as e:  # Hydra refuses some command lines with the latter two
        line = hydra_error(e)
        if line is None:  # not Hydra's: a bug, with its traceback
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    try:
        check_int("--repeats", args.repeats)
        hw = measure_cpu() if args.hardware == "measure" else hardware(args.hardware, "--hardware")
        check_int("max_model_len", cfg.get("max_model_len"), 2)
        shapes = default_shapes(cfg["max_model_len"])
        check(bool(shapes), "max_model_len", cfg["max_model_len"], "a context with room for a step to time (32 or more)")
        out = args.out or Path("runs/calibration") / f"{cfg['backend'].get('name')}-{_model_name(cfg['backend'])}.json"
        check_out(out)  # found before, not after, the work
        cost, info = calibrate(cfg, hw, shapes, args.repeats)
        out = _save(out, cost, info)
    except PagedBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    h, fit_info = cost.hardware, info["fit"]
    print(
        f"calibrated {info['backend']} on {len(shapes)} shapes: overhead {h.overhead * 1e3:.2f} ms/step, "
        f"{h.per_seq * 1e6:.0f} us/seq, {h.per_prefill * 1e6:.0f} us/prompt chunk; matmuls measured at "
        f"{len(h.matmul_curve or ())} row counts; of {h.peak_flops / 1e9:.0f} GFLOP/s and "
        f"{h.mem_bandwidth / 1e9:.1f} GB/s: attention {_pct(h.attn_eff)} / {_pct(h.kv_eff)}; "
        f"median |error| "
        f"{fit_info['median_abs_rel_err']:.1%}, max {fit_info['max_abs_rel_err']:.1%}\n"
        f"wrote {out}; use it with: python -m paged_bench backend=sim backend.preset={out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
