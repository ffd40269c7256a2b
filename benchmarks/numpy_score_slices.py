"""How large a slice of a prompt chunk's attention scores the numpy backend should hold.

The numpy backend computes a prompt chunk's attention eagerly, in slices of query rows whose
scores over every head hold at most ``model.ops_numpy.SCORE_ELEMENTS`` floats (a bound on
memory first: issue 36). The slice also sets how much a step's softmax works on at once: the
scores and the temporaries made from them (the mask, the exponentials) stay in the caches or
do not. This times prompt steps, as calibration times them (``calibration.shapes``), with each
slice size in turn, in rounds, and prints each step's median time in ms by slice size; with
``--run`` it also runs the Azure window of ``benchmarks/sim_vs_numpy.py`` (continuous batching,
512-token chunks) once per slice size in each round, the sizes taking turns, and prints its
prompt steps' busy time, run by run.

    .venv/bin/python benchmarks/numpy_score_slices.py --rounds 3 --run
"""

from __future__ import annotations

import argparse
import statistics

from sim_vs_numpy import NUMPY, overrides
from term_evidence import busy

from paged_bench.calibration.shapes import Shape, time_shapes
from paged_bench.calibration.step_replay import record
from paged_bench.model import heap, ops_numpy
from paged_bench.run import registry
from paged_bench.run.compose import compose_config

SHAPES = [Shape(0, 1, 256, 0), Shape(0, 1, 512, 0), Shape(0, 1, 512, 512), Shape(0, 1, 512, 1024),
          Shape(0, 1, 512, 2048), Shape(0, 1, 512, 3072), Shape(0, 1, 1024, 0), Shape(0, 1, 2048, 16)]  # fmt: skip
SLICES = (1 << 22, 1 << 21, 1 << 20, 1 << 19)


def label(elements: int) -> str:
    return f"{elements / (1 << 20):g} Mi floats ({4 * elements / (1 << 20):g} MiB)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds over every slice size (each step's median)")
    p.add_argument("--run", action="store_true", help="also the Azure window's prompt steps, one run per size")
    args = p.parse_args()
    shipped = ops_numpy.SCORE_ELEMENTS
    try:
        compare(args.rounds, args.run, shipped)
    finally:  # the shipped size back, whatever stopped the comparison
        ops_numpy.SCORE_ELEMENTS = shipped


def compare(rounds: int, run_azure: bool, shipped: int) -> None:
    options = dict(compose_config(*NUMPY["thread_cpu"])["backend"])
    backend = registry.create("backend", options.pop("name"), **options)
    times: dict[tuple[int, Shape], list[float]] = {}
    try:
        for _ in range(rounds):
            for elements in SLICES:
                ops_numpy.SCORE_ELEMENTS = elements
                for shape, (_, seconds) in zip(SHAPES, time_shapes(backend, backend.model_config, "float32", SHAPES)):
                    times.setdefault((elements, shape), []).append(seconds)
    finally:
        backend.close()
    print(f"prompt steps of the numpy backend's model ({backend.model_config.num_heads} heads), thread CPU time, "
          f"median of {rounds} rounds (ms); the shipped slice: {label(shipped)}\n")  # fmt: skip
    print("| chunk after context | " + " | ".join(label(e) for e in SLICES) + " |")
    print("|---|" + "---:|" * len(SLICES))
    for shape in SHAPES:
        cells = [statistics.median(times[(e, shape)]) * 1e3 for e in SLICES]
        print(f"| {shape.chunk} after {shape.context} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    if run_azure:
        print()
        azure = compose_config(*NUMPY["thread_cpu"], *overrides("azure", "continuous"), "tracking.enabled=false")
        for round_no in range(1, rounds + 1):
            for elements in SLICES:
                ops_numpy.SCORE_ELEMENTS = elements
                heap.trim()
                run = record(azure)
                prompt, decode = busy(run, run.measured)
                print(f"round {round_no}: the Azure window, continuous, slices of {label(elements)}: prompt steps "
                      f"{prompt:.2f} s of {prompt + decode:.2f} s busy", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
