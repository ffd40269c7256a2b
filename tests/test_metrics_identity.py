"""The columnar metrics and CSV code give exactly what the per-request code they replaced gave
(tests/metrics_reference.py, frozen) on the same engine result: the same summary figures to the
last bit, the same ``requests.csv`` cells (new columns aside) and the same ``steps.csv`` bytes.
One fix is allowed: a request that failed after some tokens now has its E2EL (and TPOT) end at
its last token, as vLLM's does, not when the run aborted it."""

from __future__ import annotations

import csv

import pytest

from paged_bench.results.metrics import request_figures
from paged_bench.results.records import RequestRecords
from paged_bench.results.run_files import write_run
from paged_bench.run.bench import build
from tests import metrics_reference as reference

OVERLOAD = ("workload.rate=100", "num_blocks=64", "max_batch=32")
RUNS = {
    "seed": (),
    "poisson, chunked prefill": ("workload=poisson", "workload.num_requests=300", "max_num_batched_tokens=64"),
    "preemptive recompute": (*OVERLOAD, "scheduler=preemptive", "scheduler.mode=recompute"),
    "preemptive swap": (*OVERLOAD, "scheduler=preemptive", "scheduler.mode=swap"),
    "pool runs dry (failures)": (*OVERLOAD, "scheduler=continuous"),
    "slo": ("slo.ttft_ms=300", "slo.tpot_ms=30"),
}
FIXED_FOR_FAILED = {"e2el_ms", "tpot_ms"}


def table(path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("overrides", RUNS.values(), ids=RUNS.keys())
def test_same_figures_and_tables_as_the_per_request_code(config, tmp_path, overrides):
    cfg = config("backend=sim", *overrides)
    bench = build(cfg)
    result = bench.engine.run(bench.requests)
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()

    old = reference.request_summary(result, cfg["slo"])
    new = request_figures(RequestRecords.from_requests(result.requests), result.duration, cfg["slo"])
    assert {k: new[k] for k in old} == old  # exact: same floats, not approximately

    reference.write_tables(old_dir, result)
    write_run(new_dir, result, {}, {})
    assert (old_dir / "steps.csv").read_bytes() == (new_dir / "steps.csv").read_bytes()
    old_rows, new_rows = table(old_dir / "requests.csv"), table(new_dir / "requests.csv")
    assert len(old_rows) == len(new_rows) == len(result.requests)
    for o, n in zip(old_rows, new_rows):
        fixed = FIXED_FOR_FAILED if o["finish_reason"] not in ("length", "stop") else set()
        assert {k: v for k, v in o.items() if k not in fixed} == {k: n[k] for k in o if k not in fixed}
    # and the raw text, cell for cell, where nothing was fixed
    if not result.error:
        keep = len(reference.OLD_REQUEST_COLUMNS)
        new_text = [",".join(line.split(",")[:keep]) for line in (new_dir / "requests.csv").read_text().splitlines()]
        assert (old_dir / "requests.csv").read_text().splitlines() == new_text
