"""How much a ShareGPT validation figure rests on which requests were drawn (issue 35).

``python -m paged_bench.validate`` draws a ShareGPT case's requests from the shipped table with the
published mean lengths (``paged_bench.workloads.sharegpt.sharegpt_with_means``); vLLM's own run
drew 500 other conversations of the same dataset. With every request at once the run lasts until
its longest request ends, so validate takes the mean over ``DRAWS_AT_ONCE`` draws. This runs the
registry's ShareGPT cases with every request at once (or the cases named) on each draw alone and
prints, a draw a line, its longest output and mean lengths and each figure's ratio (simulated /
published), so the spread a draw alone makes is on record.

    python benchmarks/sharegpt_draws.py [--seeds 12] [--case NAME ...]
"""

from __future__ import annotations

import argparse
import math

from paged_bench.validate.cases import load_registry
from paged_bench.validate.simulate import run_case
from paged_bench.validate.workloads import request_lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=12, help="draws 0 .. N-1 (0 is the registry's)")
    parser.add_argument("--case", action="append", help="a case name (default: ShareGPT cases at QPS inf)")
    args = parser.parse_args()
    cases = [c for f in load_registry() for c in f.cases if c.workload.dataset == "sharegpt"
             and (c.name in args.case if args.case else math.isinf(c.workload.rate))]  # fmt: skip
    if not cases:
        parser.error(f"no ShareGPT case named {args.case}")
    print("seed  longest out  mean in/out  " + "  ".join(f"{c.name} ({'/'.join(f.metric for f in c.figures)})"
                                                        for c in cases))  # fmt: skip
    for seed in range(args.seeds):
        lengths = request_lengths(cases[0].workload, seed)
        cells = []
        for case in cases:
            rows = run_case(case, time_limit_s=300, seeds=[seed])
            cells.append("/".join("failed" if r.ratio is None else f"{r.ratio:.2f}" for r in rows))
        print(f"{seed:4d}  {lengths[:, 1].max():11d}  {lengths[:, 0].mean():5.0f}/{lengths[:, 1].mean():<5.0f}  "
              + "  ".join(cells), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
