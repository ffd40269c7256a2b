"""Where a published case's simulated run spends its time: the figures conf/validation's notes
quote beside a case's ratio (issue 35).

For each ``--case`` (a name from ``python -m paged_bench.validate --list``), on its first draw:
the run as ``python -m paged_bench.validate`` simulates it, the same run with one output token a
request (its prompt steps: what the run spends before any decode), and each without the engine's
CPU price (``backend.engine_cpu=none``); with every request at once, the prompt tokens a second
over the prompt steps (the front end's intake before them included). Where every request has the same output length
and all arrive at once (a fixed-length batch: vLLM's latency and offline throughput benchmarks),
it also gives the time of one decode step and the engine CPU's share of it.

    .venv/bin/python benchmarks/case_breakdown.py --case a100-70b-tp4-pr2192-latency-bs64
    .venv/bin/python benchmarks/case_breakdown.py --case a100-70b-tp4-pr2192-latency-bs64 --override backend.decode_attention=flash

``--override KEY=VALUE`` adds a ``python -m paged_bench`` override to every case, as
``python -m paged_bench.validate --override`` does. The decode line is left out where the requests
do not fit in one batch (more than the case's ``max_batch``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
from pathlib import Path

from paged_bench.errors import ConfigError, check
from paged_bench.validate.cases import Case, Workload, chosen_cases, load_registry
from paged_bench.validate.simulate import SEED, run_draw
from paged_bench.validate.workloads import request_lengths


def one_token_each(workload: Workload) -> Workload:
    """``workload``'s requests (a ShareGPT case's draw ``SEED``, as the run sends them) with one
    output token each: the same prompts, as a listed workload."""
    prompts = tuple(int(p) for p in request_lengths(workload, SEED)[:, 0])
    return dataclasses.replace(workload, dataset="listed", prompt_lens=prompts, output_lens=(1,) * len(prompts))


def duration_s(case: Case, *overrides: str, prompts_only: bool = False) -> float:
    """The simulated run's duration, with ``overrides`` added (and one output token a request)."""
    workload = one_token_each(case.workload) if prompts_only else case.workload
    varied = dataclasses.replace(case, workload=workload, overrides=case.overrides + overrides)
    with tempfile.TemporaryDirectory(prefix="paged_bench_breakdown_") as tmp:
        return float(run_draw(varied, SEED, Path(tmp)).summary["duration"])


def breakdown(case: Case) -> list[str]:
    full, prompts = duration_s(case), duration_s(case, prompts_only=True)
    cpu = full - duration_s(case, "backend.engine_cpu=none")
    prompts_cpu = prompts - duration_s(case, "backend.engine_cpu=none", prompts_only=True)
    head = f"{case.name}: {full:.2f} s simulated, {cpu:.2f} s of it the engine's CPU; "
    w = case.workload
    lines = [head + f"prompt steps {prompts:.2f} s ({prompts_cpu:.2f} s CPU: the run with one output token each)"]
    if math.isinf(w.rate):  # with every request sent at once, how fast the prompt steps went
        tokens = int(request_lengths(w, SEED)[:, 0].sum())
        lines[0] += f", {tokens:,} prompt tokens: {tokens / prompts:,.0f} a second with the front end's intake"
    if w.dataset == "fixed" and math.isinf(w.rate) and w.output_len > 1 and w.num_requests <= _max_batch(case):
        steps, decode, decode_cpu = w.output_len - 1, full - prompts, cpu - prompts_cpu
        lines.append(f"  decode: {decode:.2f} s over {steps} steps of {w.num_requests} sequences: "
                     f"{decode / steps * 1e3:.1f} ms a step, {decode_cpu / steps * 1e3:.1f} ms of it the engine's CPU")  # fmt: skip
    return lines


def _max_batch(case: Case) -> int:
    """The sequences a step may hold (the case's ``max_batch`` override; 256, vLLM's default, without one)."""
    given = [o.split("=", 1)[1] for o in case.overrides if o.startswith("max_batch=")]
    return int(given[-1]) if given else 256


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", required=True, help="a case's name (repeatable)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="add this python -m paged_bench override to every case (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    try:
        for o in args.override:
            check(o.find("=") > 0, "--override", o, "KEY=VALUE, a python -m paged_bench override")
        cases = [dataclasses.replace(c, overrides=c.overrides + tuple(args.override))
                 for c in chosen_cases(load_registry(), args.case)]  # fmt: skip
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    for case in cases:
        print("\n".join(breakdown(case)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
