"""Which terms of the calibrated CPU cost model earn their place: each one removed, every named case replayed.

Takes a preset written by ``python -m paged_bench.calibration.calibrate`` (or by
``benchmarks/sim_vs_numpy.py``), which keeps the timed steps it was fitted to, and refits those
same steps without one term at a time (the other terms then absorb what they can, as a
calibration without the term would). Each of ``benchmarks/sim_vs_numpy.py``'s six named cases
(workload x scheduler) runs once on the numpy backend (virtual time, thread CPU timer), and
its recorded steps are priced by every refitted preset (``calibration.step_replay``): the
replay, which prices the very same steps and so is not moved by the scheduling a different
cost leads to (a queue that a few percent of cost tips one way or the other). A term's effect
on a case is the change of the predicted busy time of its prompt steps (every step with a
chunk of more than one token: what TTFT is made of) and of its decode steps (ITL), against the
preset with every term; a term is kept where it moves some case's by more than ``KEEP`` (2%).

    .venv/bin/python benchmarks/term_evidence.py --preset runs/calibration/numpy-small.json

``--terms`` limits the terms tried (default: every fitted additive term).
Its table is in docs/backends.md ("Which terms the CPU cost model keeps").
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from sim_vs_numpy import NUMPY, SCHEDULERS, WORKLOADS, overrides

from paged_bench.calibration.fit import ADDITIVE, fit, fit_errors
from paged_bench.calibration.step_replay import Recorded, record
from paged_bench.costmodel.roofline import RooflineCost, load_preset
from paged_bench.costmodel.step_work import StepWork
from paged_bench.run.compose import compose_config

KEEP = 0.02


def samples_of(info: dict) -> list[tuple[StepWork, float]]:
    """The timed steps a preset was fitted to (``samples`` in its file)."""
    if not info.get("samples"):
        raise SystemExit("error: --preset has no timed samples (written before presets kept them): calibrate again")
    known = {f.name for f in fields(StepWork)}  # a preset from before a term's removal counts its work too
    return [(StepWork(**{k: v for k, v in s["work"].items() if k in known}), float(s["seconds"]))
            for s in info["samples"]]  # fmt: skip


def without(cost: RooflineCost, info: dict, samples: list[tuple[StepWork, float]], term: str | None) -> RooflineCost:
    """``cost`` refitted to ``samples`` without ``term`` (None: with every term), the engine's
    measured per-step work added back as calibration adds it."""
    refit = fit(cost, samples, without=() if term is None else (term,))
    engine = info["engine"]
    return refit.with_fit(overhead=refit.hardware.overhead + engine["per_step_s"],
                          per_seq=refit.hardware.per_seq + engine["per_seq_s"])  # fmt: skip


def busy(run: Recorded, seconds: list[float]) -> tuple[float, float]:
    """(prompt steps' seconds, decode steps' seconds) of ``run`` priced as ``seconds``."""
    prompt = sum(t for plan, t in zip(run.plans, seconds) if any(n > 1 for n in plan.num_new_tokens))
    return prompt, sum(seconds) - prompt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", type=Path, required=True, help="a calibrated preset that keeps its samples")
    p.add_argument("--terms", default=",".join(ADDITIVE))
    args = p.parse_args()
    cost = load_preset(args.preset)
    info = json.loads(args.preset.read_text())
    samples = samples_of(info)
    full = without(cost, info, samples, None)
    runs = {case: record(compose_config(*NUMPY["thread_cpu"], *overrides(*case), "tracking.enabled=false"))
            for w in WORKLOADS for case in [(w, s) for s in SCHEDULERS]}  # fmt: skip
    base = {case: busy(run, run.priced(full)) for case, run in runs.items()}
    print(f"{len(samples)} timed steps of {args.preset}; every term refitted: median |error| "
          f"{fit_errors(full, samples)['median_abs_rel_err']:.1%}; each case's numpy run replayed (predicted "
          f"busy time of its prompt and decode steps, and the measured)\n")  # fmt: skip
    print("| term removed | fit median abs error | case | prompt steps' busy time | decode steps' busy time | kept |")
    print("|---|---:|---|---:|---:|---|")
    for case, run in runs.items():
        measured = busy(run, run.measured)
        print(f"| (every term: predicted vs measured) | | {case[0]}/{case[1]} | "
              + " | ".join(f"{b * 1e3:.0f} ms vs {m * 1e3:.0f} ms ({b / m - 1:+.1%})" for b, m in zip(base[case], measured))
              + " | |")  # fmt: skip
    for term in args.terms.split(","):
        variant = without(cost, info, samples, term)
        changes = {case: [b / a - 1 if a else 0.0 for b, a in zip(busy(run, run.priced(variant)), base[case])]
                   for case, run in runs.items()}  # fmt: skip
        kept = "yes" if max(abs(c) for pair in changes.values() for c in pair) > KEEP else "no"
        error = fit_errors(variant, samples)["median_abs_rel_err"]
        for case, (prompt, decode) in changes.items():
            print(f"| {term} | {error:.1%} | {case[0]}/{case[1]} | {prompt:+.1%} | {decode:+.1%} | {kept} |")


if __name__ == "__main__":
    main()
