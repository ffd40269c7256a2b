"""Which terms of the calibrated CPU cost model earn their place: each one removed, every named case rerun.

Takes a preset written by ``python -m paged_bench.calibration.calibrate`` (or by
``benchmarks/sim_vs_numpy.py``), which keeps the timed steps it was fitted to, refits those
same steps without one term at a time (the other terms then absorb what they can, as a
calibration without the term would), and reruns ``benchmarks/sim_vs_numpy.py``'s six named
cases (workload x scheduler) on the simulator with each refitted preset. A term's effect on a
case is the largest relative change of the case's four figures (TTFT p50 and p99, ITL p50,
output throughput) against the preset with every term; a term is kept where it moves some case
by more than ``KEEP`` (2%). The heap-growth pair is measured apart from the fit
(``calibration.heap_growth``): it is removed by setting both to 0.

    .venv/bin/python benchmarks/term_evidence.py --preset runs/calibration/numpy-small.json

``--terms`` limits the terms tried (default: every fitted additive term and the heap growth).
Its table is in docs/calibration.md ("Which terms the CPU cost model keeps").
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from sim_vs_numpy import KEYS, SCHEDULERS, WORKLOADS, overrides, run

from paged_bench.calibration.fit import ADDITIVE, fit, fit_errors
from paged_bench.costmodel.roofline import RooflineCost, load_preset, save_preset
from paged_bench.costmodel.step_work import StepWork

KEEP = 0.02
HEAP = "heap growth"  # per_heap_growth_byte with heap_bytes_per_score_byte


def samples_of(info: dict) -> list[tuple[StepWork, float]]:
    """The timed steps a preset was fitted to (``samples`` in its file)."""
    if not info.get("samples"):
        raise SystemExit("error: --preset has no timed samples (written before presets kept them): calibrate again")
    return [(StepWork(**s["work"]), float(s["seconds"])) for s in info["samples"]]


def without(cost: RooflineCost, info: dict, samples: list[tuple[StepWork, float]], term: str | None) -> RooflineCost:
    """``cost`` refitted to ``samples`` without ``term`` (None: with every term), the engine's
    measured per-step work added back as calibration adds it."""
    if term == HEAP:
        return cost.with_fit(heap_bytes_per_score_byte=0.0, per_heap_growth_byte=0.0)
    refit = fit(cost, samples, without=() if term is None else (term,))
    engine = info["engine"]
    return refit.with_fit(overhead=refit.hardware.overhead + engine["per_step_s"],
                          per_seq=refit.hardware.per_seq + engine["per_seq_s"])  # fmt: skip


def figures(preset: Path, cases: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, float]]:
    return {case: run(("backend=sim", f"backend.preset={preset}", *overrides(*case))) for case in cases}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", type=Path, required=True, help="a calibrated preset that keeps its samples")
    p.add_argument("--terms", default=",".join((*ADDITIVE, HEAP)))
    args = p.parse_args()
    cost, info = load_preset(args.preset), json.loads(args.preset.read_text())
    samples = samples_of(info)
    cases = [(w, s) for w in WORKLOADS for s in SCHEDULERS]
    terms = args.terms.split(",")
    with tempfile.TemporaryDirectory() as d:
        full = without(cost, info, samples, None)
        base_path = Path(d) / "every-term.json"
        save_preset(base_path, full, info)
        base = figures(base_path, cases)
        print(f"{len(samples)} timed steps of {args.preset}; every term refitted: median |error| "
              f"{fit_errors(full, samples)['median_abs_rel_err']:.1%}\n")  # fmt: skip
        print("| term removed | fit median abs error | case | largest change (figure) | kept |")
        print("|---|---:|---|---:|---|")
        for term in terms:
            variant = without(cost, info, samples, term)
            path = Path(d) / f"without-{term.replace(' ', '-')}.json"
            save_preset(path, variant, info)
            moved = figures(path, cases)
            changes = {case: max(((moved[case][k] / base[case][k] - 1, k) for k in KEYS), key=lambda c: abs(c[0]))
                       for case in cases}  # fmt: skip
            kept = max(abs(c[0]) for c in changes.values()) > KEEP
            error = fit_errors(variant, samples)["median_abs_rel_err"]
            for case, (change, key) in changes.items():
                print(f"| {term} | {error:.1%} | {case[0]}/{case[1]} | {change:+.1%} ({key}) | "
                      f"{'yes' if kept else 'no'} |")  # fmt: skip


if __name__ == "__main__":
    main()
