"""``python -m paged_bench.tracking.sync``: runs on disk that the store lacks are uploaded once (a second
call uploads nothing), and a sweep parent run left RUNNING by a killed process is closed.
(The same against a real MLflow server that died mid-sweep: test_remote_tracking.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from paged_bench.tracking.ui import plots_shown
from tests.tracking_support import call_cli, cli_env, fresh_store, runs_of


def _sync(cwd, *paths):
    return call_cli(cwd, *map(str, paths), module="paged_bench.tracking.sync")


def test_untracked_runs_are_uploaded_once(tmp_path):
    uri = fresh_store(tmp_path)
    for batch in (4, 8):
        assert call_cli(tmp_path, f"max_batch={batch}", "tracking.enabled=false").returncode == 0
    # a command refused leaves its record but ran nothing: sync uploaded it as a FAILED run (a
    # bad value, then a sweep's config without -m, an interpolation to nothing, hydra.job.chdir)
    for refused in (["max_batch=0"], ["+experiment=uniform_lengths"], ["max_batch=${nosuch}"],
                    ["hydra.job.chdir=true"]):  # fmt: skip
        assert call_cli(tmp_path, *refused, "tracking.enabled=false").returncode == 2
    assert len(list(tmp_path.glob("runs/20*/*/run_info.json"))) == 6
    run_dirs = sorted(p.parent for p in tmp_path.glob("runs/20*/*/summary.json"))
    assert not _has_experiment(uri)  # tracking was off: nothing in the store yet

    first = _sync(tmp_path, tmp_path / "runs")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "sync: 2 run(s) uploaded, 0 already in the store, 0 sweep parent run(s) closed"
    _, runs = runs_of(uri, "paged_bench")
    assert sorted(r.data.tags["run_dir"] for r in runs) == [str(p) for p in run_dirs]
    for run in runs:
        summary = json.loads((tmp_path / run.data.tags["run_dir"] / "summary.json").read_text())
        assert run.info.status == "FINISHED" and run.data.metrics["completed"] == summary["completed"]

    second = _sync(tmp_path, *run_dirs)
    assert second.stdout.strip() == "sync: 0 run(s) uploaded, 2 already in the store, 0 sweep parent run(s) closed"
    assert len(runs_of(uri, "paged_bench")[1]) == 2


def test_a_run_is_uploaded_to_the_store_its_config_named(tmp_path):
    # its tracking.uri was not recorded: sync copied it into the default store, beside that one
    default, own = fresh_store(tmp_path), fresh_store(tmp_path / "own")
    relative = "sqlite:///own/runs/mlflow.db"  # read from where the run ran, not where sync runs
    assert call_cli(tmp_path, "max_batch=4", "tracking.enabled=false", f"tracking.uri={relative}").returncode == 0
    (tmp_path / "elsewhere").mkdir()
    proc = _sync(tmp_path / "elsewhere", tmp_path / "runs")
    assert proc.returncode == 0 and "1 run(s) uploaded" in proc.stdout, proc.stderr
    assert len(runs_of(own, "paged_bench")[1]) == 1
    assert not _has_experiment(default)


def _has_experiment(uri):
    from tests.tracking_support import client

    return client(uri).get_experiment_by_name("paged_bench") is not None


def test_a_missing_folder_is_one_line(tmp_path):
    proc = _sync(tmp_path, tmp_path / "nope")
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: no such folder: {tmp_path / 'nope'}"


@pytest.mark.slow
def test_a_parent_left_running_by_a_killed_sweep_is_closed(tmp_path):
    uri = fresh_store(tmp_path)
    long_jobs = ["clock=wall", "workload.num_requests=20", "max_batch=4,8"]  # a second of wall time each
    proc = subprocess.Popen([sys.executable, "-m", "paged_bench", "-m", *long_jobs], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 120
    while not list(tmp_path.glob("runs/multirun/*/*/1/config.yaml")) and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)  # no clean-up at all: job 1 is cut off, the parent stays RUNNING
    proc.wait()
    _, runs = runs_of(uri, "paged_bench")
    assert [r.info.status for r in runs if r.data.tags.get("paged_bench.kind") == "sweep"] == ["RUNNING"]

    first = _sync(tmp_path, tmp_path / "runs")
    assert first.returncode == 0, first.stderr
    assert "1 sweep parent run(s) closed" in first.stdout
    _, runs = runs_of(uri, "paged_bench")
    (parent,) = [r for r in runs if r.data.tags.get("paged_bench.kind") == "sweep"]
    children = sorted((r for r in runs if r is not parent), key=lambda r: int(r.data.tags["job_num"]))
    assert parent.info.status == "FAILED"  # job 1 never recorded an end
    # counted as the sweep's own close counts them (it had no jobs_not_run tag)
    assert {k: parent.data.tags[k] for k in ("jobs", "failed_jobs", "jobs_not_run")} == {
        "jobs": "2", "failed_jobs": "1", "jobs_not_run": "0"}  # fmt: skip
    assert children[1].data.tags["error"].startswith("no results: the job stopped before it wrote any")
    assert [(r.info.run_name, r.info.status) for r in children] == [("max_batch=4", "FINISHED"),
                                                                      ("max_batch=8", "FAILED")]  # fmt: skip
    second = _sync(tmp_path, tmp_path / "runs")
    assert second.stdout.strip() == "sync: 0 run(s) uploaded, 2 already in the store, 0 sweep parent run(s) closed"


def test_a_job_killed_as_it_begins_is_still_known_by_name(monkeypatch, config, tmp_path):
    """Killed between its first two writes (as in the killed sweep above, under load), a job once
    left a config and no record: sync then logged it as "1", with no job number. Its record
    is written first now."""
    from omegaconf import OmegaConf

    from paged_bench.cli import hydra_job as job_module

    def killed(*args, **kwargs):
        raise SystemExit(-signal.SIGKILL)  # nothing after this point runs

    monkeypatch.setattr(job_module, "save_config", killed)
    monkeypatch.setattr(job_module.Job, "current", classmethod(
        lambda cls: job_module.Job(run_dir=tmp_path, multirun=False, sweep_dir=None, num=1, name="max_batch=8")))  # fmt: skip
    with pytest.raises(SystemExit):
        job_module.run(OmegaConf.create(config("tracking.enabled=false")))
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert (info["run_name"], info["job_num"]) == ("max_batch=8", 1)



def test_a_sweep_parent_sync_makes_gets_the_table_as_its_description(tmp_path):
    """As a parent closed by the sweep itself does: its report.md is the run's description."""
    uri = fresh_store(tmp_path)
    proc = call_cli(tmp_path, "-m", "max_batch=4,8", "workload.num_requests=8", "tracking.enabled=false")
    assert proc.returncode == 0, proc.stderr
    (sweep_dir,) = [p.parent for p in tmp_path.glob("runs/multirun/*/*/sweep.json")]
    synced = _sync(tmp_path, sweep_dir)
    assert synced.returncode == 0 and "1 sweep parent run(s) closed" in synced.stdout, synced.stderr
    _, runs = runs_of(uri, "paged_bench")
    (parent,) = [r for r in runs if r.data.tags.get("paged_bench.kind") == "sweep"]
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "| max_batch |" in report  # its plots shown from the server (tracking/ui.py)
    assert parent.data.tags["mlflow.note.content"] == plots_shown(report, parent.info.run_id)
