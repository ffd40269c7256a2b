"""Calibrate the simulator against a real backend: time varied batch shapes, fit the roofline.

    python -m paged_bench.calibration.calibrate backend=numpy [--out FILE] [--hardware measure]

runs the backend (any overrides of the main command pick it and its model) over decode
batches, prefill chunks and mixed steps at several context lengths, times each step as a run
meets it, times the backend's own matmuls at every row count a step may have (the
``matmul_curve``: a CPU BLAS is no roofline at a few rows), fits the roofline's
``overhead``, ``per_seq``, per-token and attention terms to what the matmuls leave
(least squares on relative error, non-negative), and saves a preset that ``backend=sim
backend.preset=FILE`` replays. ``benchmarks/sim_vs_numpy.py --replay`` checks a preset step
by step against a real run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from paged_bench.calibration.check_run import run_check
from paged_bench.calibration.engine_cost import measure_engine_cost
from paged_bench.calibration.fit import fit, fit_errors
from paged_bench.calibration.matmuls import matmul_rounds
from paged_bench.calibration.shapes import Shape, default_shapes, shape_rounds
from paged_bench.cli.hydra_errors import hydra_error
from paged_bench.costmodel.roofline import HARDWARE, Hardware, RooflineCost, hardware, measure_cpu, save_preset
from paged_bench.errors import ConfigError, PagedBenchError, check, check_int, one_line
from paged_bench.run import registry
from paged_bench.run.compose import compose_config


def calibrate(
    cfg: dict[str, Any],
    hw: Hardware,
    shapes: Sequence[Shape],
    repeats: int,
    between_rounds: Callable[[int], None] | None = None,
) -> tuple[RooflineCost, dict]:
    """Build the configured backend, time it over ``shapes``, fit; returns the cost and fit info.

    The timing goes in rounds (every shape, then every matmul row count, once a round:
    ``repeats`` rounds of shapes, at least 3 of matmuls), each figure the median of its
    rounds. ``between_rounds(n)`` runs after round ``n``: work that should meet the machine at
    the speed the calibration saw, timed amid its rounds rather than minutes after them (a
    shared VM's speed moves by 20% over minutes; ``benchmarks/sim_vs_numpy.py`` runs its real
    runs there)."""
    options = dict(cfg["backend"])
    name = options.pop("name")
    backend = registry.create("backend", name, **options)
    model = backend.model_config
    check(model is not None, "backend", name, "a real model backend (numpy, torch)")
    dtype = getattr(backend, "compute_dtype", "float32")
    try:
        shape_timer = shape_rounds(backend, model, dtype, shapes)
        longest = max(max(s.decodes + s.prefills * s.chunk for s in shapes), 1)
        matmul_timer = matmul_rounds(backend, model, longest)
        for round_no in range(max(repeats, 3)):
            if round_no < repeats:  # the first binds the backend: the matmuls run under its settings
                samples = next(shape_timer)
            curve = next(matmul_timer)
            if between_rounds is not None:
                between_rounds(round_no)
        hw = replace(hw, matmul_curve=curve, eager_attention=True)
    finally:
        backend.close()
    cost = fit(RooflineCost(model, hw, dtype), samples)
    info = {"backend": name, "backend_options": options, "fit": fit_errors(cost, samples),
            "shapes": [{**asdict(shape), "measured_ms": t * 1e3, "fitted_ms": cost.seconds(w) * 1e3}
                       for shape, (w, t) in zip(shapes, samples, strict=True)]}  # fmt: skip
    # every timed step's work and seconds, so a preset can be refitted with fewer terms
    # (benchmarks/term_evidence.py) without timing again
    info["samples"] = [{"work": asdict(w), "seconds": t} for w, t in samples]
    # a real run also pays the engine's own work per step (scheduling, allocation, update),
    # which timing backend.execute alone leaves out
    engine = measure_engine_cost(repeats=repeats, step_timer=options.get("step_timer", "wall"))
    h = cost.hardware
    cost = cost.with_fit(overhead=h.overhead + engine.per_step, per_seq=h.per_seq + engine.per_seq)
    info["engine"] = {"per_step_s": engine.per_step, "per_seq_s": engine.per_seq}
    # checked where it will be used: a real run of a workload of its own, step by step
    info["run"] = run_check(cfg, cost)
    return cost, info


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
    parser = argparse.ArgumentParser(prog="python -m paged_bench.calibration.calibrate", description=__doc__.split("\n\n")[0])
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
        f"{h.per_seq * 1e6:.0f} us/seq, {h.per_token * 1e6:.1f} us/token; matmuls measured at "
        f"{len(h.matmul_curve or ())} row counts; of {h.peak_flops / 1e9:.0f} GFLOP/s and "
        f"{h.mem_bandwidth / 1e9:.1f} GB/s: attention {_pct(h.attn_eff)} / {_pct(h.kv_eff)}; "
        f"median |error| "
        f"{fit_info['median_abs_rel_err']:.1%}, max {fit_info['max_abs_rel_err']:.1%}\n"
        f"wrote {out}; use it with: python -m paged_bench backend=sim backend.preset={out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
