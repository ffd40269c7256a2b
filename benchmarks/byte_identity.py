"""Byte identity of a simulated run's files across a change to the engine.

Runs a fixed set of simulated commands (``python -m paged_bench backend=sim ...``, as a user
runs them) and either keeps their ``requests.csv``, ``steps.csv``, ``summary.json`` and, for a
cluster, ``replicas.csv`` (``--record DIR``), or compares a new run's files with those kept
(``--compare DIR``), byte for byte. Record on the commit before a change, compare after it:

    .venv/bin/python benchmarks/byte_identity.py --record /tmp/before     # on the old commit
    .venv/bin/python benchmarks/byte_identity.py --compare /tmp/before    # on the new one

The commands cover what the step loop can do: Poisson runs of 3,000 and 20,000 requests, the
Azure conversation trace, shared prefixes under preemption by recompute and by swap (every
block hashed), sha256 block hashes, a pool so small that preemption and chunked prefill meet,
static batching on contiguous slabs, four replicas behind a prefix-affinity router, and
prefill and decode split over 2 + 2 replicas. Prints one line per command; exits 1 if any
file differs.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

POISSON = ("workload=poisson", "max_batch=32", "workload.rate=14")
SHARED = ("workload=poisson", "workload.num_requests=1000", "workload.rate=100",
          "workload.shared_prefix.num_prefixes=4", "workload.shared_prefix.length=64")  # fmt: skip
COMMANDS: dict[str, tuple[str, ...]] = {
    "poisson3k": (*POISSON, "workload.num_requests=3000"),
    "poisson20k": (*POISSON, "workload.num_requests=20000"),
    "azure3k": ("workload=azure_conv", "workload.limit=3000"),
    "recompute": (*SHARED, "scheduler=preemptive", "num_blocks=96", "max_batch=32"),
    "swap": (*SHARED, "scheduler=preemptive", "scheduler.mode=swap", "num_blocks=96", "max_batch=32",
             "allocator.defer_unshared=false"),
    "sha256": (*SHARED, "allocator.prefix_hash=sha256"),
    "starved": ("scheduler=preemptive", "num_blocks=40", "max_model_len=256", "block_size=8", "max_num_batched_tokens=64",
                "workload.rate=200", "scheduler.victim=latest_arrival"),
    "static_contiguous": ("scheduler=static", "allocator=contiguous", "max_batch=8"),
    "cluster4": (*SHARED, "cluster.replicas=4", "router=prefix_affinity"),
    "disaggregated": ("cluster.prefill_replicas=2", "cluster.decode_replicas=2", "backend.cost_model=roofline"),
}
FILES = ("requests.csv", "steps.csv", "summary.json", "replicas.csv")


def run(name: str, out: Path) -> list[str]:
    """Run command ``name``, its run folder ``out``; returns the files it wrote of ``FILES``."""
    cmd = [sys.executable, "-m", "paged_bench", "backend=sim", *COMMANDS[name], "tracking.enabled=false",
           f"hydra.run.dir={out}"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{name}: {' '.join(cmd)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return [f for f in FILES if (out / f).exists()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", type=Path, help="keep each command's files in this folder")
    mode.add_argument("--compare", type=Path, help="compare each command's files with those kept here")
    parser.add_argument("--only", nargs="+", choices=sorted(COMMANDS), help="these commands only")
    args = parser.parse_args(argv)
    differ = 0
    for name in args.only or COMMANDS:
        if args.record:
            made = run(name, args.record / name)
            print(f"{name:18} recorded {', '.join(made)}")
            continue
        with tempfile.TemporaryDirectory() as d:
            made = run(name, Path(d) / name)
            kept = [f for f in FILES if (args.compare / name / f).exists()]
            changed = [f for f in kept if f not in made or not filecmp.cmp(Path(d) / name / f, args.compare / name / f,
                                                                           shallow=False)]  # fmt: skip
            changed += [f"{f} (new)" for f in made if f not in kept]
            differ += bool(changed)
            print(f"{name:18} {'differs: ' + ', '.join(changed) if changed else 'identical: ' + ', '.join(kept)}")
            if changed and args.record is None:
                shutil.copytree(Path(d) / name, Path(tempfile.gettempdir()) / f"byte_identity_{name}", dirs_exist_ok=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
