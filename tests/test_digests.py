"""``requests.csv``'s digests check runs token for token: a real model's greedy outputs do not
depend on how requests were batched, so two schedulers give the same ``output_digest`` per
request, and a changed output shows as a changed digest."""

from __future__ import annotations

import csv

from paged_bench.results.records import token_digest
from paged_bench.run.job import run_job

RUN = ("backend=numpy", "backend.model=tiny", "backend.threads=1", "workload=uniform", "workload.num_requests=6",
       "workload.rate=200", "workload.prompt_len=16", "workload.output_len=8", "max_model_len=64",
       "tracking.enabled=false")  # fmt: skip


def digests(outcome) -> list[str]:
    with (outcome.run_dir / "requests.csv").open() as f:
        return [row["output_digest"] for row in csv.DictReader(f)]


def test_the_same_outputs_whatever_the_batching(config, tmp_path):
    one_by_one = run_job(config(*RUN, "scheduler=static", "max_batch=1"), tmp_path / "static")
    together = run_job(config(*RUN, "scheduler=continuous", "max_batch=6"), tmp_path / "continuous")
    assert digests(one_by_one) == digests(together)
    assert digests(together) == [token_digest(r.output_token_ids) for r in together.result.requests]
    assert len(set(digests(together))) > 1  # different prompts, different outputs


def test_a_different_output_has_a_different_digest(config, tmp_path):
    base = run_job(config(*RUN), tmp_path / "base")
    shorter = run_job(config(*RUN, "workload.output_len=7"), tmp_path / "shorter")
    assert all(a != b for a, b in zip(digests(base), digests(shorter)))
