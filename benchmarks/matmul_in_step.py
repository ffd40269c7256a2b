"""What a decode step's matmuls cost inside the step, beside the calibration's back-to-back curve.

Calibration prices a step's matmuls from ``matmul_curve``: the layers' products timed back to
back at each row count (``paged_bench.calibration.matmuls``), then fits a per-step constant, a
per-sequence cost and the rest to what the whole steps leave. This measures what the products
cost as a step meets them, on the numpy backend as calibration runs it (thread CPU timer): each
decode batch of ``--rows`` sequences is timed as calibration times a shape
(``shapes.time_shape``), then again with the layers' products handed back from a first, untimed
pass (every other operation of the step runs as before, on the values of that pass). The difference is
what the products add to the step: their own time and whatever they cost the operations around
them (the caches they take). Rounds interleave every batch size and both ways; each figure is
the median of its rounds, the range beside it.

    .venv/bin/python benchmarks/matmul_in_step.py [--rounds 5] [--rows 1 2 3 4 6 8 12 16]

On a machine whose speed moves by minutes, compare the columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from paged_bench.backends.base import Backend
from paged_bench.calibration.matmuls import time_matmuls
from paged_bench.calibration.shapes import Shape, time_shape
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.run import registry
from paged_bench.run.compose import compose_config

CONTEXT = 16  # tokens each decoding sequence holds: attention stays small beside the matmuls


@contextmanager
def layers_replayed(backend: Backend) -> Iterator[None]:
    """While open, ``backend.ops.linear`` hands back each layer product's result from the first
    time it was asked for (per row count and weight) instead of multiplying again; the LM head
    still multiplies (the forward only reads the results, so sharing them is safe)."""
    ops, head = backend.ops, backend.weights.lm_head
    linear: Callable[[Any, Any], Any] = ops.linear
    done: dict[tuple[int, int], Any] = {}

    def replayed(x: Any, weight: Any) -> Any:
        if weight is head:
            return linear(x, weight)
        key = (len(x), id(weight))
        if key not in done:
            done[key] = linear(x, weight)
        return done[key]

    ops.linear = replayed
    try:
        yield
    finally:
        ops.linear = linear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 12, 16])
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least 1")
    bad = [n for n in args.rows if not 1 <= n <= 16]
    if bad:
        ap.error(f"--rows {bad[0]}: 1 to 16 (the curve it is compared with times every row count up to 16)")
    options = dict(compose_config("backend=numpy", "clock=virtual", "backend.step_timer=thread_cpu")["backend"])
    backend = registry.create("backend", options.pop("name"), **options)
    model = backend.model_config
    allocator = PagedAllocator(num_blocks=4 * max(args.rows) + 1, block_size=16, prefix_caching=False, swap_blocks=0)
    backend.bind(allocator)
    rng = np.random.default_rng(0)
    whole: dict[int, list[float]] = {n: [] for n in args.rows}
    without: dict[int, list[float]] = {n: [] for n in args.rows}
    try:
        for _ in range(args.rounds + 1):  # the first round warms up
            for n in args.rows:
                shape = Shape(n, 0, 0, CONTEXT)
                whole[n].append(time_shape(backend, shape, allocator, rng)[1])
                with layers_replayed(backend):
                    time_shape(backend, shape, allocator, rng)  # the layers' results, untimed
                    without[n].append(time_shape(backend, shape, allocator, rng)[1])
        curve = {int(rows): layers for rows, layers, _ in time_matmuls(backend, model, max(args.rows), args.rounds)}
    finally:
        backend.close()
    print(f"numpy backend, model {options['model']}, thread CPU time; median of {args.rounds} rounds "
          f"(range); load average {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print("| decoding sequences | step (ms) | step, layers' products handed back (ms) | the products in the step (ms) "
          "| back to back: calibration's curve (ms) | in the step / back to back |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.rows:
        steps, rest = whole[n][1:], without[n][1:]
        added = [a - b for a, b in zip(steps, rest)]
        print(f"| {n} | {statistics.median(steps) * 1e3:.2f} | {statistics.median(rest) * 1e3:.2f} | "
              f"{statistics.median(added) * 1e3:.2f} ({min(added) * 1e3:.2f}-{max(added) * 1e3:.2f}) | "
              f"{curve[n] * 1e3:.2f} | {statistics.median(added) / curve[n]:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
