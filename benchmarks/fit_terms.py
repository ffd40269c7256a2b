"""What each fitted term of the calibrated roofline earns: the same timed steps fitted with every
term, then with each additive term left at 0.

Times the calibration's step shapes once on ``backend=numpy`` (``--repeats`` rounds, as
``python -m paged_bench.calibration.calibrate`` times them) with a measured matmul curve, then fits
them as calibration does, again without each term, and prints each fit's median and largest
|error| and its median error on three kinds of shape: prompt chunks of 64 tokens or more at a
context of 16 or less (a fresh prompt's prefill), the same at a context of 128 or more, and
decode batches. A term that earns its place lowers the errors when it is in.

    .venv/bin/python benchmarks/fit_terms.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from paged_bench.calibration import matmuls as cal_matmuls
from paged_bench.calibration import shapes as cal_shapes
from paged_bench.calibration.fit import ADDITIVE, fit, fit_errors
from paged_bench.costmodel.roofline import RooflineCost, measure_cpu
from paged_bench.run import registry
from paged_bench.run.compose import compose_config

KINDS = {
    "prompt, context <= 16": lambda s: s.prefills and s.chunk >= 64 and s.context <= 16,
    "prompt, context >= 128": lambda s: s.prefills and s.chunk >= 64 and s.context >= 128,
    "decodes": lambda s: not s.prefills,
}


def timed_samples(repeats: int) -> tuple[RooflineCost, list[cal_shapes.Shape], list]:
    """The numpy backend's calibration shapes, timed, and the roofline with its matmul curve."""
    options = dict(compose_config("backend=numpy")["backend"])
    backend = registry.create("backend", options.pop("name"), **options)
    model, shapes = backend.model_config, cal_shapes.default_shapes(4096)
    try:
        samples = cal_shapes.time_shapes(backend, model, "float32", shapes, repeats)
        longest = max(s.decodes + s.prefills * s.chunk for s in shapes)
        curve = cal_matmuls.time_matmuls(backend, model, longest, max(repeats, 3))
    finally:
        backend.close()
    hardware = replace(measure_cpu(), matmul_curve=curve, eager_attention=True)
    return RooflineCost(model, hardware, "float32"), shapes, samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="timing rounds over the shapes (their median)")
    args = p.parse_args()
    start, shapes, samples = timed_samples(args.repeats)
    print(f"{len(shapes)} step shapes timed on backend=numpy, "
          f"median of {args.repeats} rounds\n")  # fmt: skip
    print("| fit | median abs error | largest | " + " | ".join(f"{k}: median error" for k in KINDS) + " |")
    print("|---|---:|---:|" + "---:|" * len(KINDS))
    for left_out in (None, *ADDITIVE):
        cost = fit(start, samples, without=() if left_out is None else (left_out,))
        errors = fit_errors(cost, samples)
        by_kind = [statistics.median(cost.seconds(w) / t - 1 for (w, t), s in zip(samples, shapes) if pick(s))
                   for pick in KINDS.values()]  # fmt: skip
        label = "every term" if left_out is None else f"without {left_out}"
        print(f"| {label} | {errors['median_abs_rel_err']:.1%} | {errors['max_abs_rel_err']:.1%} | "
              + " | ".join(f"{e:+.1%}" for e in by_kind) + " |")


if __name__ == "__main__":
    main()
