"""Sweeps: one MLflow parent run per sweep with a child per job (also across joblib worker
processes), the summary table and plots on the parent when the sweep ends, also when jobs
failed or one raised, a non-zero exit when any job failed, and the sweep's progress."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from paged_bench.cli.progress import JobBar, SweepBar
from paged_bench.cli.sweep_folder import SWEEP_FILE, job_counts
from paged_bench.cli.sweep_jobs import count_jobs
from paged_bench.run.outcome import Progress
from tests.plugin_support import fake_distribution
from tests.tracking_support import (
    PACED,
    artifact_paths,
    call_cli,
    cli_env,
    fresh_store,
    run_cli,
    runs_of,
    wait_for_jobs,
)

REPORT_FILES = {"table.csv", "table.md", "report.md", "ttft_cdf.png", "vs_max_batch.png", "kv_over_time.png"}


def _sweep_dir(root):
    (path,) = [p.parent for p in root.glob(f"runs/multirun/*/*/{SWEEP_FILE}")]
    return path


def _split(runs):
    parents = [r for r in runs if r.data.tags.get("paged_bench.kind") == "sweep"]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    return parents[0], sorted(children, key=lambda r: int(r.data.tags["job_num"]))


def test_a_sweep_is_a_parent_run_with_a_child_per_job_and_exits_1_when_jobs_fail(tmp_path):
    uri = fresh_store(tmp_path)
    proc = call_cli(tmp_path, "-m", "scheduler=static,continuous", "max_batch=4,-1")
    assert proc.returncode == 1, proc.stderr
    assert "error: 2 of 4 sweep jobs did not finish" in proc.stderr
    assert proc.stderr.count("max_batch=-1 is not allowed") == 2 and "Traceback" not in proc.stderr
    sweep_dir = _sweep_dir(tmp_path)
    assert f"4 job(s), 2 not finished -> {sweep_dir}" in proc.stdout

    c, runs = runs_of(uri, "paged_bench")
    parent, children = _split(runs)
    assert len(runs) == 5 and len(children) == 4
    assert parent.info.status == "FAILED"  # closed, never left RUNNING
    assert parent.data.params == {"scheduler": "static,continuous", "max_batch": "4,-1"}
    assert parent.data.tags["failed_jobs"] == "2" and parent.data.tags["jobs"] == "4"
    assert parent.data.tags["launcher"] == "basic" and "launcher_overrides" not in parent.data.tags
    assert REPORT_FILES <= artifact_paths(c, parent.info.run_id)
    assert "| static" in parent.data.tags["mlflow.note.content"]  # the summary is the parent's description
    assert [r.info.run_name for r in children] == [
        "scheduler=static max_batch=4", "scheduler=static max_batch=-1",
        "scheduler=continuous max_batch=4", "scheduler=continuous max_batch=-1",
    ]  # fmt: skip
    assert [r.info.status for r in children] == ["FINISHED", "FAILED", "FINISHED", "FAILED"]
    assert "max_batch=-1 is not allowed" in children[1].data.tags["error"]
    # the summary table on disk is the jobs' own figures
    import pandas as pd

    table = pd.read_csv(sweep_dir / "report" / "table.csv")
    for job in (0, 2):
        summary = json.loads((sweep_dir / str(job) / "summary.json").read_text())
        row = table[table["job"] == job].iloc[0]
        assert row["output_throughput"] == pytest.approx(summary["output_throughput"])
        assert children[job].data.metrics["median_ttft_ms"] == pytest.approx(summary["median_ttft_ms"])
    assert list(table["status"]) == ["finished", "failed", "finished", "failed"]
    # its view in the UI (tests/test_remote_tracking.py opens one in a browser): the jobs, failed
    # ones too, with both swept settings and the key figures as columns; the link make ui serves
    exp = c.get_experiment(parent.info.experiment_id)
    envelope = json.loads(exp.tags[f"mlflow.sharedViewState.{parent.info.run_id}"])
    view = json.loads(envelope["state"])
    assert envelope["name"] == parent.info.run_name and exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert view["searchFilter"] == f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    assert view["selectedColumns"][:4] == ["params.`scheduler.name`", "params.`max_batch`", "metrics.`median_ttft_ms`",
                                           "metrics.`p99_ttft_ms`"]  # fmt: skip
    url = f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning"
    assert f"MLflow UI: {url}&viewStateShareKey={parent.info.run_id} (make ui serves it)" in proc.stdout


CRASHING_PLUGIN = """
from paged_bench.core.scheduler.base import Scheduler


class CrashingScheduler(Scheduler):
    name = "crash"

    def schedule(self, now):
        raise RuntimeError("boom: a bug in a plugin")
"""


def test_a_job_that_raises_still_gets_the_sweep_closed_and_summarised(tmp_path):
    """Hydra skips on_multirun_end when a job raises: the parent run must not stay RUNNING."""
    uri = fresh_store(tmp_path)
    plugins = fake_distribution(tmp_path / "site", "crashing-plugins",
                                {"paged_bench.schedulers": {"crash": "crashing_plugins:CrashingScheduler"}},
                                {"crashing_plugins": CRASHING_PLUGIN})  # fmt: skip
    proc = run_cli(tmp_path, "-m", "scheduler.name=continuous,crash", PYTHONPATH=str(plugins))
    assert proc.returncode == 1
    assert "boom: a bug in a plugin" in proc.stderr  # a bug keeps its traceback
    assert "2 job(s), 1 not finished" in proc.stdout
    _, runs = runs_of(uri, "paged_bench")
    parent, children = _split(runs)
    assert parent.info.status == "FAILED"
    assert [(r.info.status, r.data.tags["status"]) for r in children] == [
        ("FINISHED", "finished"),
        ("FAILED", "failed"),
    ]
    assert "RuntimeError: boom" in children[1].data.tags["error"]
    info = json.loads((_sweep_dir(tmp_path) / "1" / "run_info.json").read_text())
    assert info["status"] == "failed" and "boom" in info["error"]


def test_a_failing_store_does_not_stop_a_sweep(tmp_path):
    (tmp_path / "garbage.db").write_text("not a database\n" * 100)
    proc = call_cli(tmp_path, "-m", "max_batch=4,8", MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'garbage.db'}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning: MLflow tracking failed") == 1
    sweep_dir = _sweep_dir(tmp_path)
    assert all(json.loads((sweep_dir / j / "summary.json").read_text())["completed"] == 48 for j in "01")
    assert (sweep_dir / "report" / "table.md").is_file()


def test_an_experiment_sweep_groups_under_its_name_and_reports_from_mlflow(tmp_path):
    uri = fresh_store(tmp_path)
    proc = call_cli(tmp_path, "-m", "+experiment=seed_paging")
    assert proc.returncode == 0, proc.stderr
    _, runs = runs_of(uri, "seed_paging")
    parent, children = _split(runs)
    assert parent.info.status == "FINISHED" and [r.info.run_name for r in children] == [
        "allocator=contiguous",
        "allocator=paged",
    ]
    reserved = [r.data.metrics["kv_reserved_slots_peak"] for r in children]
    report = call_cli(tmp_path, "--experiment", "seed_paging", module="paged_bench.report")
    assert report.returncode == 0, report.stderr
    assert "### seed_paging" in report.stdout and "paged vs contiguous" in report.stdout
    gain = reserved[0] / reserved[1]
    row = next(line for line in report.stdout.splitlines() if "KV reserved peak" in line and "|" in line)
    assert f"{gain:.2f}x" in row and f"{int(reserved[0]):,}" in row  # the figures logged, side by side
    assert (tmp_path / "runs" / "reports" / "seed_paging" / "kv_over_time.png").is_file()


@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_and_marks_it_killed(tmp_path):
    uri = fresh_store(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "paged_bench", "-m", "max_batch=1,2", *PACED], cwd=tmp_path,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for_jobs(tmp_path, "runs/multirun/*/*/0/run_info.json")  # inside job 0's engine loop
    assert proc.poll() is None, "the job ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "2 job(s), 1 not finished, 1 not run" in out  # the interrupted job; the other never ran
    _, runs = runs_of(uri, "paged_bench")
    parent, children = _split(runs)
    assert parent.info.status == "KILLED"
    assert [(r.info.run_name, r.info.status) for r in children] == [("max_batch=1", "KILLED")]
    assert not (_sweep_dir(tmp_path) / "1").exists()  # Ctrl-C stopped the sweep, not just the job


@pytest.mark.slow
def test_a_joblib_sweep_logs_children_from_worker_processes(tmp_path):
    uri = fresh_store(tmp_path)
    proc = run_cli(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "max_batch=4,8")
    assert proc.returncode == 0, proc.stderr
    assert "Joblib.Parallel" in proc.stdout + proc.stderr  # it really was the joblib launcher
    _, runs = runs_of(uri, "paged_bench")
    parent, children = _split(runs)
    assert parent.info.status == "FINISHED"
    assert [(r.info.run_name, r.info.status) for r in children] == [
        ("max_batch=4", "FINISHED"),
        ("max_batch=8", "FINISHED"),
    ]
    assert all(r.data.metrics["completed"] == 48 for r in children)


# -- the pieces, in-process -------------------------------------------------------------------


def _config(params: dict, task: list[str], sweeper: str = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"):
    return OmegaConf.create(
        {"hydra": {"sweeper": {"_target_": sweeper, "params": params}, "overrides": {"task": task}}}
    )


def test_count_jobs_follows_the_basic_sweeper():
    assert count_jobs(_config({"scheduler": "static,continuous", "max_batch": "2,4,8,16,32"}, [])) == 10
    assert (
        count_jobs(_config({"scheduler": "static,continuous"}, ["max_batch=2,4", "seed=1,2,3", "block_size=8"])) == 12
    )
    assert count_jobs(_config({"max_batch": "2,4,8"}, ["max_batch=16,32"])) == 2  # the command line wins
    assert count_jobs(_config({}, ["max_batch=range(1,5)"])) == 4
    assert count_jobs(_config({}, ["max_batch=2,4"], sweeper="hydra_plugins.optuna.OptunaSweeper")) is None


def test_job_counts_read_the_job_folders(tmp_path):
    for job, status in enumerate(["finished", "failed", "finished"]):
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "run_info.json").write_text(json.dumps({"status": status}))
    (tmp_path / "3").mkdir()  # still running: no status yet
    assert job_counts(tmp_path) == (3, 1)


def test_progress_bars_show_requests_throughput_and_jobs(tmp_path):
    out = io.StringIO()
    bar = JobBar(file=out, delay=0, disable=False)
    progress = Progress(total=48)
    for i in range(1, 49):
        progress.finished, progress.output_tokens, progress.now = i, 50 * i, 0.1 * i
        bar(progress)
    bar.close()
    assert "48/48" in out.getvalue() and "500 tok/s" in out.getvalue()

    for job, status in enumerate(["finished", "failed"]):
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "run_info.json").write_text(json.dumps({"status": status}))
    out = io.StringIO()
    SweepBar(tmp_path, 3, job_counts, file=out, delay=0, interval=0.01, disable=False).close()
    assert "2/3" in out.getvalue() and "1 failed" in out.getvalue()


def test_progress_bars_stay_quiet_for_short_runs():
    out = io.StringIO()
    bar = JobBar(file=out, disable=False)  # the default delay: nothing within the first seconds
    bar(Progress(total=10, finished=10, output_tokens=100, now=1.0))
    bar.close()
    assert out.getvalue() == ""
