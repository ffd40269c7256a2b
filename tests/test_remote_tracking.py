"""Tracking against a real ``mlflow server`` (a subprocess on a free loopback port): a single
run and a sweep land on it, and a server that dies mid-sweep loses nothing, because
``python -m paged_bench.tracking.sync`` uploads the rest once it is back (and a second sync, nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from paged_bench.tracking.runs import rounded
from tests.tracking_support import MlflowServer, artifact_paths, call_cli, cli_env, client, runs_of


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module (starting one takes seconds): each test logs to an experiment
    of its own."""
    srv = MlflowServer(tmp_path_factory.mktemp("remote")).start()
    yield srv
    srv.stop()


FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}  # a dead server: refused at once, not retried for seconds


def _split(runs):
    (parent,) = [r for r in runs if r.data.tags.get("paged_bench.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return parent, sorted(children, key=lambda r: int(r.data.tags["job_num"]))


def test_a_run_and_a_sweep_log_to_a_real_server(tmp_path, server):
    work = tmp_path / "work"
    work.mkdir()
    proc = call_cli(work, "max_batch=8", MLFLOW_TRACKING_URI=server.uri, **FAIL_FAST)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    (run_dir,) = [p.parent for p in work.glob("runs/20*/*/summary.json")]
    summary = json.loads((run_dir / "summary.json").read_text())
    c, (run,) = runs_of(server.uri, "paged_bench")
    assert run.info.status == "FINISHED" and run.data.params["max_batch"] == "8"
    assert run.data.metrics["median_ttft_ms"] == rounded(summary["median_ttft_ms"])
    assert {"summary.json", "steps.csv", "config.yaml", "plots"} <= artifact_paths(c, run.info.run_id)
    assert not (work / "runs" / "mlflow.db").exists()  # nothing went to the embedded store

    proc = call_cli(work, "-m", "max_batch=4,8", MLFLOW_TRACKING_URI=server.uri, **FAIL_FAST)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    _, runs = runs_of(server.uri, "paged_bench")
    parent, children = _split([r for r in runs if r.info.run_id != run.info.run_id])
    assert parent.info.status == "FINISHED" and "table.md" in artifact_paths(c, parent.info.run_id)
    (sweep_dir,) = [p.parent for p in work.glob("runs/multirun/*/*/sweep.json")]
    assert parent.data.tags["mlflow.note.content"] == (sweep_dir / "report" / "report.md").read_text()
    assert [(r.info.run_name, r.info.status) for r in children] == [("max_batch=4", "FINISHED"),
                                                                      ("max_batch=8", "FINISHED")]  # fmt: skip


def _sync(cwd, *paths, **env):
    return call_cli(cwd, *map(str, paths), module="paged_bench.tracking.sync", **env)


@pytest.mark.slow
def test_a_server_that_dies_mid_sweep_loses_nothing_after_sync(tmp_path, server):
    work = tmp_path / "work"
    work.mkdir()
    long_jobs = ["workload.num_requests=1500", "max_batch=4,8,16", "experiment_name=dies_mid_sweep"]
    proc = subprocess.Popen([sys.executable, "-m", "paged_bench", "-m", *long_jobs], cwd=work,
                            env=cli_env(MLFLOW_TRACKING_URI=server.uri, **FAIL_FAST),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    c = client(server.uri)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # the first job is on the server: kill it
        exp = c.get_experiment_by_name("dies_mid_sweep")
        runs = c.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'") if exp else []
        if any("mlflow.parentRunId" in r.data.tags for r in runs):
            break
        time.sleep(0.2)
    server.stop()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err  # the sweep itself succeeded; only tracking failed
    assert err.count("warning: MLflow tracking failed") == 1, err
    (sweep_dir,) = [p.parent for p in work.glob("runs/multirun/*/*/sweep.json")]
    assert "3 job(s), 0 not finished" in out
    report = call_cli(work, "--experiment", "dies_mid_sweep", module="paged_bench.report",
                      MLFLOW_TRACKING_URI=server.uri, **FAIL_FAST)  # fmt: skip
    assert report.returncode == 1 and report.stderr.startswith("error: report failed: MlflowException:"), report.stderr
    assert report.stderr.count("\n") == 1  # one line, as sync says it, not a traceback

    server.start()
    _, runs = runs_of(server.uri, "dies_mid_sweep")
    parent, children = _split(runs)
    kept = [r for r in children if r.data.tags.get("paged_bench.uploaded") == "true"]  # others: cut off mid-upload
    assert parent.info.status == "RUNNING" and 1 <= len(kept) < 3  # what the dead server kept

    first = _sync(work, sweep_dir, MLFLOW_TRACKING_URI=server.uri)
    assert first.returncode == 0, first.stderr
    assert f"{3 - len(kept)} run(s) uploaded, {len(kept)} already in the store, 1 sweep parent" in first.stdout
    _, runs = runs_of(server.uri, "dies_mid_sweep")
    parent, children = _split(runs)
    assert parent.info.status == "FINISHED"
    # the sweep's table as the description, as when the sweep closes its parent itself
    assert parent.data.tags["mlflow.note.content"] == (sweep_dir / "report" / "report.md").read_text()
    assert [(r.info.run_name, r.info.status) for r in children] == [
        (f"max_batch={b}", "FINISHED") for b in (4, 8, 16)
    ]
    for child in children:
        summary = json.loads((sweep_dir / child.data.tags["job_num"] / "summary.json").read_text())
        assert child.data.metrics["completed"] == summary["completed"] == 1500

    second = _sync(work, work / "runs", MLFLOW_TRACKING_URI=server.uri)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "sync: 0 run(s) uploaded, 3 already in the store, 0 sweep parent run(s) closed"
    assert len(runs_of(server.uri, "dies_mid_sweep")[1]) == 4  # a broken upload is deleted, not listed
