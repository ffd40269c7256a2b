"""What measuring a finished run costs: summary figures plus ``requests.csv``/``steps.csv``, the
columnar code against the per-request code it replaced (tests/metrics_reference.py), side by
side on one engine result, with a check that both write the same content.

One simulated run (by default the issue's 20,000-request poisson run at max_batch 32), then
each way is timed ``--repeats`` times (best kept): the summary's request figures, and writing
the two tables. Prints milliseconds, microseconds per engine step and the ratio. Run from the
repository root:

    .venv/bin/python benchmarks/metrics_outputs.py
    .venv/bin/python benchmarks/metrics_outputs.py workload.num_requests=2000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the frozen reference lives in tests/

from paged_bench.results.metrics import request_figures  # noqa: E402
from paged_bench.results.records import RequestRecords  # noqa: E402
from paged_bench.results.run_files import REQUEST_COLUMNS, write_run  # noqa: E402
from paged_bench.run.bench import build  # noqa: E402
from paged_bench.run.compose import compose_config  # noqa: E402
from tests import metrics_reference as reference  # noqa: E402

RUN = ("backend=sim", "workload=poisson", "max_batch=32", "workload.rate=14", "workload.num_requests=20000",
       "tracking.enabled=false")  # fmt: skip


def best_of(repeats: int, tasks: dict) -> dict[str, float]:
    """The best time of each task, the tasks taking turns so that both ways see the same load."""
    best = dict.fromkeys(tasks, float("inf"))
    for _ in range(repeats):
        for name, fn in tasks.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def same_content(old_dir: Path, new_dir: Path) -> bool:
    """The old tables equal the new ones once the new columns are dropped."""
    keep = len(reference.OLD_REQUEST_COLUMNS)
    assert REQUEST_COLUMNS[:keep] == reference.OLD_REQUEST_COLUMNS
    old_requests = (old_dir / "requests.csv").read_text().splitlines()
    new_requests = [",".join(line.split(",")[:keep]) for line in (new_dir / "requests.csv").read_text().splitlines()]
    return old_requests == new_requests and (old_dir / "steps.csv").read_bytes() == (new_dir / "steps.csv").read_bytes()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("overrides", nargs="*", help="config overrides on top of the 20,000-request run")
    args = p.parse_args()
    bench = build(compose_config(*RUN, *args.overrides))
    start = time.perf_counter()
    result = bench.engine.run(bench.requests)
    engine_s = time.perf_counter() - start
    steps = len(result.steps)
    with tempfile.TemporaryDirectory() as tmp:
        old_dir, new_dir = Path(tmp, "old"), Path(tmp, "new")
        old_dir.mkdir()
        records = RequestRecords.from_requests(result.requests)
        timings = best_of(args.repeats, {
            "old figures": lambda: reference.request_summary(result),
            "old tables": lambda: reference.write_tables(old_dir, result),
            "new records": lambda: RequestRecords.from_requests(result.requests),
            "new figures": lambda: request_figures(records, result.duration),
            "new tables": lambda: write_run(new_dir, result, {}, {}, records),
        })
        identical = same_content(old_dir, new_dir)
        old_figures = reference.request_summary(result)
        new_figures = request_figures(records, result.duration)
        figures_equal = all(new_figures[k] == v for k, v in old_figures.items())
    print(f"run: {len(result.requests)} requests, {steps} steps, engine {engine_s:.2f} s "
          f"({steps / engine_s:,.0f} steps/s)")  # fmt: skip
    for name, seconds in timings.items():
        print(f"  {name:<16} {seconds * 1e3:8.1f} ms  {seconds / steps * 1e6:6.2f} us/step")
    old = timings["old figures"] + timings["old tables"]
    new = timings["new records"] + timings["new figures"] + timings["new tables"]
    print(f"  metrics+CSV: old {old / steps * 1e6:.2f} us/step, new {new / steps * 1e6:.2f} us/step, "
          f"new/old = {new / old:.2f}")  # fmt: skip
    print(f"  same figures: {figures_equal}; same table content (new columns dropped): {identical}")


if __name__ == "__main__":
    main()
