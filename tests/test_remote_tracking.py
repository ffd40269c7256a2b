"""Tracking against a real ``mlflow server`` (a subprocess on a free loopback port): a single
run and a sweep land on it, and a server that dies mid-sweep loses nothing, because
``python -m paged_bench.tracking.sync`` uploads the rest once it is back (and a second sync, nothing)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from paged_bench.tracking import browser
from paged_bench.tracking.runs import rounded
from paged_bench.tracking.ui import plots_shown
from tests.tracking_support import MlflowServer, artifact_paths, call_cli, cli_env, client, runs_of


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module (starting one takes seconds): each test logs to an experiment
    of its own."""
    srv = MlflowServer(tmp_path_factory.mktemp("remote")).start()
    yield srv
    srv.stop()


FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}  # a dead server: refused at once, not retried for seconds


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    """A two-job sweep logged to the server, made once: what it logged is checked from the
    command's side (the runs, the report as the parent's description) and, where Chromium is
    installed, in the MLflow UI; (its folder, what the command returned)."""
    work = tmp_path_factory.mktemp("sweep")
    proc = call_cli(work, "-m", "max_batch=4,8", "workload.num_requests=20", "experiment_name=sweep_view",
                    MLFLOW_TRACKING_URI=server.uri, **FAIL_FAST)  # fmt: skip
    return work, proc


def _split(runs):
    (parent,) = [r for r in runs if r.data.tags.get("paged_bench.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return parent, sorted(children, key=lambda r: int(r.data.tags["job_num"]))


def test_a_run_and_a_sweep_log_to_a_real_server(tmp_path, server, sweep):
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

    work, proc = sweep
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    _, runs = runs_of(server.uri, "sweep_view")
    parent, children = _split(runs)
    assert parent.info.status == "FINISHED" and "table.md" in artifact_paths(c, parent.info.run_id)
    (sweep_dir,) = [p.parent for p in work.glob("runs/multirun/*/*/sweep.json")]
    # the report as its description, its plots shown from where the server serves the run's artifacts
    report = (sweep_dir / "report" / "report.md").read_text()
    shown = f"![ttft cdf](get-artifact?path=ttft_cdf.png&run_uuid={parent.info.run_id})"
    assert "![ttft cdf](ttft_cdf.png)" in report and shown in parent.data.tags["mlflow.note.content"]
    assert parent.data.tags["mlflow.note.content"] == plots_shown(report, parent.info.run_id)
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
    report = (sweep_dir / "report" / "report.md").read_text()
    assert parent.data.tags["mlflow.note.content"] == plots_shown(report, parent.info.run_id)
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


def test_sync_to_a_named_server_uploads_only_the_runs_meant_for_it(tmp_path, server):
    """With $MLFLOW_TRACKING_URI naming a team's server, sync uploaded every run under runs/,
    those made against the embedded store too: now only the runs (and sweeps) meant for it go,
    the others are counted, and --include-other-stores uploads them as well."""
    work = tmp_path / "work"
    work.mkdir()
    quick = ("workload.num_requests=8", "experiment_name=sync_by_store", "tracking.enabled=false")
    with_password = server.uri.replace("http://", "http://team:secret@")  # the same server, with credentials
    for name, uri in (("team_run", with_password), ("local_run", None)):  # made while the server was down, say
        proc = call_cli(work, *quick, f"hydra.run.dir=runs/{name}", **_env(uri))
        assert proc.returncode == 0, proc.stderr
    proc = call_cli(work, "-m", *quick, "max_batch=4,8", "hydra.sweep.dir=runs/team_sweep", **_env(server.uri))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((work / "runs/team_run/run_info.json").read_text())["tracking_uri"] == server.uri  # no password
    # a run and a sweep written before runs recorded their store: taken as meant for the embedded one
    shutil.copytree(work / "runs/local_run", work / "runs/old_run")
    shutil.copytree(work / "runs/team_sweep", work / "runs/old_sweep")
    for record in (work / "runs/old_run/run_info.json", work / "runs/old_sweep/sweep.json"):
        record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "tracking_uri"}))

    first = _sync(work, work / "runs", MLFLOW_TRACKING_URI=server.uri)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == ("sync: 3 run(s) uploaded, 0 already in the store, 1 sweep parent run(s) closed, "
                                    "4 meant for other stores skipped")  # fmt: skip
    (note,) = first.stderr.strip().splitlines()
    embedded = f"sqlite:///{work / 'runs' / 'mlflow.db'}"
    assert note == (f"note: 4 run(s) meant for other stores not uploaded to {server.uri} (4 for {embedded}; 3 of "
                    "these written before runs recorded their store: taken as meant for the embedded one): add "
                    "--include-other-stores to upload them there too, or leave the store unnamed to upload each "
                    "to its own")  # fmt: skip
    _, on_server = runs_of(server.uri, "sync_by_store")
    team = {str(work / "runs/team_run")} | {str(work / f"runs/team_sweep/{j}") for j in "01"}
    assert {r.data.tags["run_dir"] for r in on_server if "run_dir" in r.data.tags} == team
    parent, children = _split(on_server)
    assert parent.info.status == "FINISHED" and [r.info.run_name for r in children] == ["max_batch=4", "max_batch=8"]

    again = _sync(work, work / "runs", MLFLOW_TRACKING_URI=server.uri)
    assert again.stdout.strip() == ("sync: 0 run(s) uploaded, 3 already in the store, 0 sweep parent run(s) closed, "
                                    "4 meant for other stores skipped")  # fmt: skip

    every = _sync(work, work / "runs", "--include-other-stores", MLFLOW_TRACKING_URI=server.uri)
    assert every.returncode == 0 and every.stderr == "", every.stderr
    assert every.stdout.strip() == "sync: 4 run(s) uploaded, 3 already in the store, 1 sweep parent run(s) closed"
    _, on_server = runs_of(server.uri, "sync_by_store")
    assert len(on_server) == 9  # 7 runs and 2 sweep parents
    old_sweep = next(r for r in on_server if r.data.tags.get("sweep_dir") == str(work / "runs/old_sweep"))
    assert sum(r.data.tags.get("mlflow.parentRunId") == old_sweep.info.run_id for r in on_server) == 2
    assert not (work / "runs" / "mlflow.db").exists()  # a sync to a server never opened the embedded store


def _env(uri):
    return {"MLFLOW_TRACKING_URI": uri, **FAIL_FAST} if uri else {}


KEY_COLUMNS = ["params.`max_batch`", "metrics.`median_ttft_ms`", "metrics.`p99_ttft_ms`", "metrics.`median_tpot_ms`",
               "metrics.`output_throughput`", "metrics.`kv_reserved_slots_peak`", "metrics.`num_preemptions`"]  # fmt: skip


@pytest.mark.skipif(browser.executable() is None, reason="no chromium: make install installs it (apt, as root)")
def test_the_url_a_sweep_prints_shows_its_jobs_key_figures_in_a_browser(server, sweep):
    """The MLflow UI showed a sweep as one collapsed row with Run Name, Created, Dataset, Duration,
    Source and Models, in the GenAI mode: the URL the sweep prints now opens its jobs as rows with
    their swept setting and key figures as columns (read from the page Chromium renders), in the
    machine-learning mode; the parent run charts each key figure by job."""
    work, proc = sweep
    assert proc.returncode == 0, proc.stderr
    c, runs = runs_of(server.uri, "sweep_view")
    parent, children = _split(runs)
    exp = parent.info.experiment_id
    url = f"{server.uri}/#/experiments/{exp}/runs?workflowType=machine_learning&viewStateShareKey={parent.info.run_id}"
    assert proc.stdout.splitlines()[-1] == f"MLflow UI: {url}"
    assert [(m.step, m.value) for m in c.get_metric_history(parent.info.run_id, "by_job/median_ttft_ms")] == [
        (int(r.data.tags["job_num"]), r.data.metrics["median_ttft_ms"]) for r in children]  # fmt: skip

    with browser.Chromium(width=2400, height=900) as page:
        page.goto(url)
        page.wait_for("document.querySelectorAll('.ag-center-cols-container [role=row][row-id]').length >= 2")
        table = page.runs_table()
        nav = page.evaluate("document.querySelector('nav').innerText")
        page.goto(f"{server.uri}/#/experiments/{exp}/runs/{parent.info.run_id}?workflowType=machine_learning")
        plots = "[...document.querySelectorAll('img[src^=\"get-artifact\"]')].filter(i => i.naturalWidth > 0).length"
        shown = page.wait_for(f"{plots} >= 3 && {plots}")  # the parent's description shows the sweep's plots
    headers = table["headers"]
    assert [k for k in headers if k in KEY_COLUMNS] == KEY_COLUMNS, headers  # shown, in this order
    assert [headers[k] for k in KEY_COLUMNS] == [k.split("`")[1] for k in KEY_COLUMNS]
    assert list(table["rows"]) == [r.info.run_id for r in children]  # the jobs in order, not the parent's collapsed row
    for child in children:
        cells = table["rows"][child.info.run_id]
        assert cells["params.`max_batch`"] == child.data.params["max_batch"]
        assert float(cells["metrics.`median_ttft_ms`"]) == pytest.approx(child.data.metrics["median_ttft_ms"], rel=1e-5)
    assert "Model registry" in nav and "Evaluation runs" not in nav  # the ML mode's pages, not GenAI's
    assert shown == len(list((work / "runs").glob("multirun/*/*/report/*.png")))
