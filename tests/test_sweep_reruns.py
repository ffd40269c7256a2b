"""Reruns into a used folder, and sweeps refused before any job: a job's folder starts clean of
an earlier run's results; a sweep counts, reports and logs only the jobs it launched (found by
what they recorded, whatever ``hydra.sweep.subdir`` names their folders), not an earlier
sweep's nor older runs below it; a sweep of no jobs, or over experiments that are sweeps of
their own, is one line and exit 2; a sweep whose batch Hydra refuses prints no empty table."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from paged_bench.cli import sweep, sweep_folder
from tests.tracking_support import call_cli, client, fresh_store, in_a_child, runs_of, sweep_config

SMALL = ["workload.num_requests=20"]
UNTRACKED = [*SMALL, "tracking.enabled=false"]


def _children(uri: str, experiment: str):
    _, runs = runs_of(uri, experiment)
    (parent,) = [r for r in runs if r.data.tags.get("paged_bench.kind") == "sweep"]
    return parent, [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]


def test_a_sweep_rerun_into_its_folder_reports_and_logs_only_its_own_jobs(tmp_path):
    uri = fresh_store(tmp_path)
    first = call_cli(tmp_path, "-m", "max_batch=2,8", *SMALL, "hydra.sweep.dir=runs/same", "experiment_name=first")
    assert first.returncode == 0, first.stderr
    # job 0 fails before it measures anything; job 1's folder is the first sweep's alone
    # (a pool too small for one sequence: refused as the job builds its engine, not before the sweep)
    second = call_cli(tmp_path, "-m", "num_blocks=2", *SMALL, "hydra.sweep.dir=runs/same", "experiment_name=second")
    assert second.returncode == 1, second.stderr
    assert "1 job(s), 1 not finished" in second.stdout
    assert "| metric" not in second.stdout  # no empty table of the one job's figures
    job = tmp_path / "runs" / "same" / "0"
    assert not (job / "summary.json").exists() and not (job / "steps.csv").exists()
    info = json.loads((job / "run_info.json").read_text())
    assert info["status"] == "failed" and "num_steps" not in info  # not merged into the first run's record
    assert (tmp_path / "runs" / "same" / "1" / "summary.json").is_file()  # another run's folder is left alone

    parent, children = _children(uri, "second")
    assert parent.data.tags["jobs"] == "1" and parent.data.tags["failed_jobs"] == "1"
    assert [(c.data.params["num_blocks"], c.info.status) for c in children] == [("2", "FAILED")]
    assert "median_ttft_ms" not in children[0].data.metrics  # not the first run's figures


def test_a_sweep_counts_only_its_jobs_not_older_runs_below_its_folder(tmp_path):
    old = call_cli(tmp_path, *UNTRACKED, "hydra.run.dir=runs/nest/old")
    assert old.returncode == 0, old.stderr
    proc = call_cli(tmp_path, "-m", "max_batch=2,8", *UNTRACKED, "hydra.sweep.dir=runs/nest")
    assert proc.returncode == 0, proc.stderr
    assert "2 job(s), 0 not finished" in proc.stdout
    table = (tmp_path / "runs" / "nest" / "report" / "table.csv").read_text().splitlines()
    assert len(table) == 3  # its header and the sweep's two jobs


def test_a_reused_run_folder_keeps_no_results_of_the_run_before(tmp_path):
    run_dir = tmp_path / "runs" / "again"
    assert call_cli(tmp_path, *UNTRACKED, f"hydra.run.dir={run_dir}").returncode == 0
    (run_dir / "plots").mkdir()
    (run_dir / "notes.txt").write_text("mine")
    proc = call_cli(tmp_path, *UNTRACKED, "max_batch=0", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr
    assert not any((run_dir / name).exists() for name in ("summary.json", "requests.csv", "steps.csv", "plots"))
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "failed"
    assert (run_dir / "notes.txt").read_text() == "mine"  # not the project's file: kept


def _sweep_folder(tmp_path, started: float) -> str:
    sweep_id = "this-sweep"
    sweep_folder.write_info(tmp_path, {"id": sweep_id, "started": started, "pid": os.getpid()})
    return sweep_id


def _hydra_job(run_dir, num: int, overrides: list[str]) -> None:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {num}\n")
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run_dir / ".hydra" / "config.yaml").write_text("workload: {}\nscheduler: {}\nbackend: {}\n")


def test_job_folders_are_found_by_their_record_not_their_name(tmp_path):
    """``hydra.sweep.subdir=${hydra.job.override_dirname}``: a job cut off before it recorded
    who it is is recorded interrupted under its number; an earlier sweep's job is not this one's."""
    sweep_id = _sweep_folder(tmp_path, time.time() - 60)
    running, cut_off, earlier = tmp_path / "max_batch=4", tmp_path / "max_batch=8", tmp_path / "max_batch=2"
    _hydra_job(running, 0, ["max_batch=4"])
    (running / "run_info.json").write_text(json.dumps({"run_name": "max_batch=4", "job_num": 0,
                                                       "sweep_id": sweep_id}))  # fmt: skip
    _hydra_job(cut_off, 1, ["max_batch=8"])
    _hydra_job(earlier, 0, ["max_batch=2"])
    (earlier / "run_info.json").write_text(json.dumps({"job_num": 0, "sweep_id": "an-earlier-sweep"}))
    an_hour_ago = time.time() - 3600
    os.utime(earlier / ".hydra" / "hydra.yaml", (an_hour_ago, an_hour_ago))

    assert sweep_folder.started_jobs(tmp_path) == [running, cut_off]
    sweep_folder.record_unfinished(tmp_path, "ended")
    info = json.loads((cut_off / "run_info.json").read_text())
    assert (info["status"], info["job_num"], info["run_name"]) == ("interrupted", 1, "max_batch=8")
    assert "status" not in json.loads((earlier / "run_info.json").read_text())
    assert sweep_folder.job_counts(tmp_path) == (2, 2)


STOPPABLE_JOB = """
import json, pathlib, signal, sys, time
record = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    record.write_text(json.dumps({**json.loads(record.read_text()), "status": "interrupted"}))
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
print("ready", flush=True)
time.sleep(30)
"""


def test_a_stopping_sweep_passes_the_signal_to_jobs_in_folders_not_named_by_number(tmp_path):
    config = sweep_config(tmp_path, "max_batch=4")
    run_dir = tmp_path / "max_batch=4"
    run_dir.mkdir()
    record = run_dir / "run_info.json"
    record.write_text("{}")
    job = subprocess.Popen([sys.executable, "-c", STOPPABLE_JOB, str(record)], stdout=subprocess.PIPE, text=True)

    def scenario() -> None:  # the sweep's process: Ctrl-C on it, its handler passes it on
        sweep.start(config)
        sweep_id = sweep_folder.sweep_info(tmp_path)["id"]
        record.write_text(json.dumps({"sweep_id": sweep_id, "job_num": 0, "pid": job.pid,
                                      "host": socket.gethostname()}))  # fmt: skip
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            return
        raise AssertionError("Ctrl-C did not stop the sweep")

    try:
        assert job.stdout.readline() == "ready\n"
        in_a_child(scenario)
        assert job.wait(timeout=5) == 0
    finally:
        job.kill()
        job.wait()
    assert json.loads(record.read_text())["status"] == "interrupted"


def test_a_sweep_over_experiments_that_are_sweeps_is_refused_before_any_job(tmp_path):
    proc = call_cli(tmp_path, "-m", "+experiment=seed_paging,block_size", *UNTRACKED)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "seed_paging, block_size are sweeps" in lines[0], proc.stderr
    assert "python -m paged_bench -m +experiment=NAME" in lines[0]
    assert not list(tmp_path.glob("runs/multirun/*/*/*/run_info.json"))


def test_experiments_may_be_swept_when_the_command_line_gives_their_swept_keys(tmp_path):
    proc = call_cli(tmp_path, "-m", "+experiment=seed_paging,block_size", "allocator=paged", "block_size=16",
                   *UNTRACKED)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "2 job(s), 0 not finished" in proc.stdout


def test_a_sweep_of_no_jobs_is_refused_and_logs_no_parent(tmp_path):
    uri = fresh_store(tmp_path)
    proc = call_cli(tmp_path, "-m", "max_batch=range(4,4)", *SMALL)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: max_batch='range(4,4)' is not allowed: a sweep of at least one value (this one has no jobs)"
    ]
    assert "job(s)" not in proc.stdout
    assert not [r for e in client(uri).search_experiments() for r in client(uri).search_runs([e.experiment_id])]


def test_a_batch_hydra_refuses_prints_no_table_and_writes_no_report(tmp_path):
    proc = call_cli(tmp_path, "-m", "scheduler=continuous,preemptive", "+scheduler.mode=swap", *UNTRACKED,
                   "hydra.sweep.dir=runs/refused")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "|" not in proc.stdout and "job(s)" not in proc.stdout
    assert not (tmp_path / "runs" / "refused" / "report").exists()


def test_a_sweep_logs_no_store_setting_as_a_param_a_name_or_a_tag(tmp_path):
    """A tracking URI may carry credentials: the runs' params leave tracking.* out, but the sweep
    parent's params, its overrides tag and its jobs' run names carried it."""
    uri = fresh_store(tmp_path)
    proc = call_cli(tmp_path, "-m", "max_batch=2,4", "workload.num_requests=10", f"tracking.uri={uri}",
                   "experiment_name=no_store_params")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    _, runs = runs_of(uri, "no_store_params")
    assert len(runs) == 3
    for run in runs:
        shown = [*run.data.params, *run.data.params.values(), run.info.run_name, *run.data.tags.values()]
        assert not any("tracking" in str(text) or uri in str(text) for text in shown), run.info.run_name
