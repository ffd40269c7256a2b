"""``python -m paged_bench`` as a user runs it: files written, summary printed, bad input refused."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paged_bench.results.metrics import LATENCIES, PERCENTILES, SPREADS
from tests.tracking_support import Ran, call_cli

SUMMARY_KEYS = {
    *(f"{p}_{m}_ms" for m in LATENCIES for p in (*PERCENTILES, *SPREADS)),
    "max_output_tokens_per_s", "max_concurrent_requests",
    "completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput",
    "kv_live_slots_peak", "kv_reserved_slots_peak", "kv_utilization_mean", "kv_waste_pct",
    "num_preemptions", "recomputed_tokens", "swapped_blocks", "prefix_cache_hit_rate", "preempted_prefix_hit_tokens",
    "kv_capacity_blocks", "kv_capacity_tokens", "num_gpus", "output_throughput_per_gpu",
}  # fmt: skip


def cli(tmp_path: Path, *overrides: str) -> tuple[Ran, Path]:
    """``python -m paged_bench OVERRIDES`` into ``tmp_path/run``, untracked, run in-process as a
    fresh process would (``call_cli``): what it prints, its files and its exit status."""
    run_dir = tmp_path / "run"
    return call_cli(tmp_path, *overrides, f"hydra.run.dir={run_dir}", "tracking.enabled=false"), run_dir


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_default_run_writes_its_files_and_prints_a_summary(tmp_path):
    proc, run_dir = cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "TTFT median / p99 (ms)" in proc.stdout and "workload=seed" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary) == SUMMARY_KEYS
    assert summary["completed"] == 48 and summary["failed"] == 0
    requests = rows(run_dir / "requests.csv")
    assert len(requests) == 48 and {r["finish_reason"] for r in requests} == {"length"}
    assert sum(int(r["output_tokens"]) for r in requests) == summary["total_output_tokens"]
    steps = rows(run_dir / "steps.csv")
    assert len(steps) == json.loads((run_dir / "run_info.json").read_text())["num_steps"] > 0


def test_the_printed_summary_counts_swapped_blocks(tmp_path):
    """summary.json had them; the summary printed (and on the MLflow run's page) left them out."""
    proc, run_dir = cli(tmp_path, "workload.num_requests=40", "workload.rate=100", "scheduler=preemptive",
                        "scheduler.mode=swap", "num_blocks=40")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    swapped = json.loads((run_dir / "summary.json").read_text())["swapped_blocks"]
    assert swapped > 0
    assert re.search(r"^  swapped blocks \(out \+ in\) +(\d+)$", proc.stdout, re.MULTILINE).group(1) == str(swapped)


def test_help_names_the_options_a_run_takes(tmp_path):
    """--help showed ``workload: name: poisson`` only, while the run says ``workload=seed``."""
    out = call_cli(tmp_path, "--help", "scheduler=static").stdout  # the defaults, and what the command line chose
    assert ("workload=seed, scheduler=static, allocator=paged, backend=sim, target=engine, cluster=colocated, "
            "router=round_robin, frontend=none\n") in out  # fmt: skip
    assert "workload=seed runs poisson" in out


def test_the_readme_command_block_size_one(tmp_path):
    proc, run_dir = cli(tmp_path, "backend=sim", "scheduler=continuous", "block_size=1")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kv_live_slots_peak"] == summary["kv_reserved_slots_peak"]


@pytest.mark.parametrize(
    "override, expected",
    [
        ("block_size=0", "block_size=0 is not allowed: an integer from 1 to 2,147,483,647"),
        ("block_size=abc", "block_size='abc' is not allowed: an integer from 1 to 2,147,483,647"),
        ("max_batch=-1", "max_batch=-1 is not allowed: an integer >= 1"),
        ("scheduler=nonexistent", "scheduler=nonexistent is not allowed: one of continuous, preemptive, static"),
        ("workload.rate=-3", "workload.rate=-3 is not allowed: a number > 0"),
        # an infinite cost puts the clock at inf: every figure inf or nan
        ("backend.step_overhead_ms=inf", "backend.step_overhead_ms=inf is not allowed: a finite number >= 0.0"),
        ("backend.per_kv_token_us=nan", "backend.per_kv_token_us=nan is not allowed: a finite number >= 0.0"),
    ],
)
def test_bad_values_end_with_one_clear_line(tmp_path, override, expected):
    proc, run_dir = cli(tmp_path, override)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"error: {expected}"] if "nonexistent" not in override else expected in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "summary.json").exists()


def test_a_pool_too_small_stops_continuous_with_its_results_kept(tmp_path):
    proc, run_dir = cli(tmp_path, "scheduler=continuous", "workload.rate=100", "num_blocks=64", "max_batch=32")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "KV pool exhausted" in last and "scheduler=preemptive" in last and str(run_dir) in last
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"] > 0
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "failed" and "KV pool exhausted" in info["error"]
    reasons = {r["finish_reason"] for r in rows(run_dir / "requests.csv")}
    assert "error" in reasons


def test_a_closed_pipe_is_not_an_error(tmp_path):
    """``python -m paged_bench --help | head``: the reader may go away before the help is written."""
    proc = subprocess.Popen([sys.executable, "-m", "paged_bench", "--help"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    proc.stdout.close()  # the reader is gone before anything was written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == ""


@pytest.mark.parametrize("override, key", [("max_batch=1000000000", "max_batch"), ("num_blocks=1000000000", "num_blocks"),
                                           ("backend=numpy num_blocks=20000000", "num_blocks"),
                                           ("cluster.replicas=1000000", "cluster.replicas"),
                                           ("workload.num_requests=10000000000", "workload.num_requests"),
                                           ("workload.prompt_len=2000000000", "workload.prompt_len")])  # fmt: skip
def test_a_run_bigger_than_memory_is_refused_before_it_is_allocated(tmp_path, override, key):
    """KV pools (one, or one per replica) and a workload's prompts: a numpy MemoryError
    traceback, or minutes of building replicas, before these checks."""
    proc, run_dir = cli(tmp_path, *override.split())
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {key}=") and "GiB needed" in line and "GiB available" in line
    assert not (run_dir / "summary.json").exists()


def test_an_experiment_that_sweeps_needs_multirun(tmp_path):
    proc, run_dir = cli(tmp_path, "+experiment=seed_paging")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: this config is a sweep (allocator=contiguous,paged): run it with -m, "
                                   "or give each of those keys one value")  # fmt: skip
    assert not (run_dir / "summary.json").exists()
    proc, run_dir = cli(tmp_path, "+experiment=seed_paging", "allocator=paged")  # one value: one run
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run_dir / "summary.json").read_text())["completed"] == 48


def test_a_run_whose_every_request_fails_is_a_failed_run(tmp_path):
    """Every prompt longer than max_model_len: each request rejected with its reason. The run
    failed (as an HTTP run where every request fails), with what it measured kept."""
    proc, run_dir = cli(tmp_path, "max_model_len=10")
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "all 48 requests failed, e.g.: prompt of" in last and "(max_model_len=10)" in last
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "failed"
    assert {r["finish_reason"] for r in rows(run_dir / "requests.csv")} == {"rejected"}


@pytest.mark.parametrize(
    "args, expected",
    [
        (["max_batch=${nope}"], "error: max_batch: Interpolation key 'nope' not found"),
        (["workload=null"], "error: workload=null is not allowed: an option name, one of azure_conv, bursty, "),  # Hydra named no group
        (["--cfg", "job", "-m", "max_batch=1,2"], "error: Only one of --run, --multirun"),
        (["--experiments", "extra"], "error: --experiments takes nothing after it (got extra"),
        # refused before its model loads (it was the first step that failed); its option sets max_batch 1
        (["backend=hf_generate", "max_batch=16"], "error: max_batch=16 is not allowed: at most 1 with backend=hf_generate"),
        # a cluster's refusals name the key (before: a traceback, the whole target mapping, "cluster")
        (["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "backend.dtype=fp8"],
         "error: backend.dtype='fp8' is not allowed: float32, bfloat16, float16"),
        (["cluster.replicas=2", "target=openai"], "error: target='openai' is not allowed"),
        (["cluster.replicas=2", "clock=wall"], "error: clock='wall' is not allowed: virtual for 2 replicas"),
        # a distribution switched alone keeps the keys of the one it replaces
        (["workload=uniform", "workload.prompt_len.dist=fixed"],
         "error: workload.prompt_len.high=160 is not allowed: no key of dist=fixed, which takes value"),
        # a copy of a top-level knob, overridden alone, sized the pool from the other value
        (["allocator.block_size=1"], "error: allocator.block_size=1 is not allowed: block_size's value, 16"),
        (["allocator=contiguous", "allocator.max_model_len=5"], "error: allocator.max_model_len=5 is not allowed"),
        # no rank count can help: the share of the device is the value to blame
        (["backend.cost_model=roofline", "backend.gpu_memory_utilization=0.01"],
         "error: backend.gpu_memory_utilization=0.01 is not allowed: a larger share"),
    ],
)  # fmt: skip
def test_command_lines_refused_in_one_line(tmp_path, args, expected):
    proc, run_dir = cli(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), proc.stderr
    assert not (run_dir / "summary.json").exists()
