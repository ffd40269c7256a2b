"""Whole-run simulator cost in machine instructions per engine step: ``sim_speed.py``'s figure
counted instead of timed, so that it holds still on a machine shared with other work.

Each checkout's command (``python -m paged_bench backend=sim ... tracking.enabled=false``, as
a user runs it) runs under ``valgrind --tool=callgrind``, which counts the instructions the
process executes (``I refs``): the same binary, inputs and environment give the same count
within a fraction of a percent (``PYTHONHASHSEED=0`` pins the string hashes that order dicts),
whatever else the machine is doing. Start-up is cancelled as ``sim_speed.py`` cancels it: the
same command cut to 50 requests runs too, and

    instructions per step = (I refs - I refs of the 50-request twin) / (steps - steps of the twin)

An instruction is not a second (a cache miss costs more than an add): use this to decide
between two versions of the code, and ``sim_speed.py`` on a quiet machine for the figure itself.
``--python`` names each checkout's interpreter (its virtualenv's ``bin/python``), so two
checkouts compare in one run:

    .venv/bin/python benchmarks/sim_instructions.py --python /work/before/.venv/bin/python .venv/bin/python

Each command takes one to two minutes under callgrind (``--case poisson3k``: under a minute).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

POISSON = ("workload=poisson", "max_batch=32", "workload.rate=14")
CASES = {
    "poisson20k": (*POISSON, "workload.num_requests=20000"),
    "poisson3k": (*POISSON, "workload.num_requests=3000"),
}
TWIN = "workload.num_requests=50"


def count(python: str, overrides: tuple[str, ...]) -> tuple[int, int]:
    """(instructions, steps) of one command run by ``python`` under callgrind."""
    with tempfile.TemporaryDirectory() as d:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/callgrind.out",
               python, "-m", "paged_bench", "backend=sim", *overrides, "tracking.enabled=false",
               f"hydra.run.dir={d}/run"]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        refs = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
        if proc.returncode != 0 or refs is None:
            sys.exit(f"{' '.join(cmd)} failed: {proc.stderr.strip().splitlines()[-3:]}")
        with open(Path(d) / "run" / "steps.csv") as f:
            steps = sum(1 for _ in f) - 1
    return int(refs.group(1).replace(",", "")), steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", nargs="+", default=[sys.executable], help="each checkout's interpreter")
    parser.add_argument("--case", choices=sorted(CASES), default="poisson20k")
    args = parser.parse_args(argv)
    rows = []
    for python in args.python:
        full, twin = count(python, CASES[args.case]), count(python, (*POISSON, TWIN))
        per_step = (full[0] - twin[0]) / (full[1] - twin[1])
        rows.append((python, full[1], per_step))
        print(f"{python}: {full[1]:,} steps, {per_step:,.0f} instructions a step", file=sys.stderr, flush=True)
    first = rows[0][2]
    print(f"\n| checkout | steps | instructions a step (start-up cancelled) | vs the first |")
    print("|---|---:|---:|---:|")
    for python, steps, per_step in rows:
        print(f"| {python} | {steps:,} | {per_step:,.0f} | {per_step / first:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
