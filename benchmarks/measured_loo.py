"""Leave-one-out check of the measured cost model's kernel fits (issue 35).

For each GPU (h100, a100) and each profiled model, fits the GPU's matmul surface and
elementwise costs WITHOUT that model's profiles, then predicts the model's per-layer time (its
four matmuls and elementwise ops, what Vidur's profiles time as a layer) at 1, 16, 256 and 2,048
tokens and every profiled TP degree, beside the measured figure. Prints one row per (GPU, model,
TP), then per GPU the median |error| and the share of points within 10%, and the worst error.

    .venv/bin/python benchmarks/measured_loo.py [--tp 1] [--gpu h100 a100]
"""

from __future__ import annotations

import argparse
import statistics

from paged_bench.costmodel.measured.loo import TOKENS, leave_one_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", nargs="+", default=["h100", "a100"])
    ap.add_argument("--tp", type=int, nargs="+", default=None, help="TP degrees (default: all profiled)")
    args = ap.parse_args()
    worst, errors = 0.0, {gpu: [] for gpu in args.gpu}
    head = " ".join(f"{t:>6} tok: meas/pred/err" for t in TOKENS)
    print(f"{'gpu':5} {'held-out model':26} {'tp':>2}  {head}")
    for gpu in args.gpu:
        for case in leave_one_out(gpu, args.tp):
            cells = []
            for p in case.points:
                worst = max(worst, abs(p.error))
                errors[gpu].append(abs(p.error))
                cells.append(f"{p.measured_ms:7.3f}/{p.predicted_ms:7.3f}/{p.error:+6.1%}")
            print(f"{gpu:5} {case.model:26} {case.tp:>2}  {'  '.join(cells)}")
    for gpu, errs in errors.items():
        within = sum(e <= 0.10 for e in errs) / len(errs) if errs else 0.0
        print(f"{gpu}: median |error| {statistics.median(errs):.1%}, {within:.0%} of {len(errs)} points within 10%")
    print(f"worst |error|: {worst:.1%}")


if __name__ == "__main__":
    main()
