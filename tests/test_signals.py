"""SIGTERM and SIGHUP (``timeout``, a SLURM time limit, a closed terminal) stop a run or a sweep
the way Ctrl-C does: the jobs in flight end KILLED with what they measured, the sweep's parent
is closed and its report written, the exit status is the signal's; and Ctrl-C on a joblib
sweep logs its interrupted jobs, counts only jobs that started, and leaks no semaphores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.tracking_support import PACED, cli_env, fresh_store, in_a_child, runs_of, wait_for_jobs


def _start(tmp_path, *args, group: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "paged_bench", *args], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=group)  # fmt: skip


def _split(runs):
    (parent,) = [r for r in runs if r.data.tags.get("paged_bench.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return parent, sorted(children, key=lambda r: int(r.data.tags["job_num"]))


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_a_run_killed_with_its_figures_and_the_signals_status(tmp_path, signum):
    uri = fresh_store(tmp_path)
    proc = _start(tmp_path, "max_batch=1", *PACED)
    wait_for_jobs(tmp_path, "runs/20*/*/run_info.json")
    assert proc.poll() is None, "the run ended before the signal"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1].startswith("error: run interrupted") and "Traceback" not in err
    (run_dir,) = [p.parent for p in tmp_path.glob("runs/20*/*/summary.json")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 < summary["completed"] < 2000
    _, (run,) = runs_of(uri, "paged_bench")
    assert run.info.status == "KILLED" and run.data.metrics["completed"] == summary["completed"]


@pytest.mark.slow
def test_sigterm_closes_a_sweep_with_its_report_and_the_killed_jobs_figures(tmp_path):
    uri = fresh_store(tmp_path)
    proc = _start(tmp_path, "-m", "scheduler=static,continuous", "max_batch=2,4", *PACED)
    wait_for_jobs(tmp_path, "runs/multirun/*/*/0/run_info.json")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM" in err and "4 job(s), 1 not finished, 3 not run" in out
    (sweep_dir,) = [p.parent for p in tmp_path.glob("runs/multirun/*/*/sweep.json")]
    assert (sweep_dir / "report" / "table.md").is_file()
    _, runs = runs_of(uri, "paged_bench")
    assert "RUNNING" not in {r.info.status for r in runs}
    parent, (child,) = _split(runs)
    assert parent.info.status == "KILLED" and parent.data.tags["failed_jobs"] == "1"
    assert parent.data.tags["jobs_not_run"] == "3"
    summary = json.loads((sweep_dir / "0" / "summary.json").read_text())
    assert child.info.status == "KILLED" and child.data.metrics["completed"] == summary["completed"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(("n_jobs", "max_batch", "how"), [
    (2, "4,8,16", "ctrl-c"),  # the third job is handed to a worker as the sweep stops: not run
    (3, "4,8", "ctrl-c"),  # a worker idle when Ctrl-C lands must not take the others down with it
    (2, "4,8,16", "sigterm"),  # `kill PID`: the sweep's process passes it on to its jobs' processes
])  # fmt: skip
def test_ctrl_c_on_a_joblib_sweep_logs_the_interrupted_jobs(tmp_path, n_jobs, max_batch, how):
    """Both jobs running when the signal lands end KILLED with what they measured (no worker
    is SIGKILLed while it writes, none starts another job), the rest are not run."""
    uri = fresh_store(tmp_path)
    proc = _start(tmp_path, "-m", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={n_jobs}", f"max_batch={max_batch}",
                  *PACED, group=True)  # fmt: skip  (a minute and more a job: neither ends first)
    wait_for_jobs(tmp_path, "runs/multirun/*/*/*/run_info.json", count=2)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to every process of the command
    else:
        proc.send_signal(signal.SIGTERM)  # to the sweep's process only
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (130 if how == "ctrl-c" else 143), err
    assert "leaked semaphore" not in err and "Traceback" not in err
    _, runs = runs_of(uri, "paged_bench")
    parent, children = _split(runs)
    assert parent.info.status == "KILLED"
    assert [(r.info.run_name, r.info.status) for r in children] == [("max_batch=4", "KILLED"),
                                                                      ("max_batch=8", "KILLED")]  # fmt: skip
    (sweep_dir,) = [p.parent for p in tmp_path.glob("runs/multirun/*/*/sweep.json")]
    for child in children:  # what they measured before the signal, written whole and logged
        summary = json.loads((sweep_dir / child.data.tags["job_num"] / "summary.json").read_text())
        assert 0 < child.data.metrics["completed"] == summary["completed"] < 2000
    not_run = len(max_batch.split(",")) - 2
    assert parent.data.tags["failed_jobs"] == "2" and parent.data.tags["jobs_not_run"] == str(not_run)
    # how it was launched, which wall-clock figures depend on (the overrides tag left it out)
    assert parent.data.tags["launcher"] == "joblib"
    assert parent.data.tags["launcher_overrides"] == f"hydra/launcher=joblib hydra.launcher.n_jobs={n_jobs}"
    assert not (sweep_dir / "2").exists()  # one handed to a worker as the sweep stopped is withdrawn


@pytest.mark.slow
def test_a_signal_while_the_sweep_opens_leaves_no_parent_running(tmp_path):
    """SIGTERM while the sweep creates its parent run (a tracking helper that must start first
    takes seconds): the parent is created, then closed KILLED, never left RUNNING."""
    uri = fresh_store(tmp_path)
    env = cli_env(MLFLOW_TEST_NONCE=str(time.time()))  # a helper of its own: a slow, cold start
    proc = subprocess.Popen([sys.executable, "-m", "paged_bench", "-m", "max_batch=2,4"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 60
    while not list(tmp_path.glob("runs/multirun/*/*")) and time.time() < deadline:
        time.sleep(0.05)  # Hydra made the sweep folder: the callback is opening the sweep
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    from tests.tracking_support import client

    exp = client(uri).get_experiment_by_name("paged_bench")
    runs = client(uri).search_runs([exp.experiment_id]) if exp else []
    assert all(r.info.status != "RUNNING" for r in runs), [(r.info.run_name, r.info.status) for r in runs]


def test_a_terminated_job_s_exception_crosses_to_the_sweep_s_process():
    """A joblib worker sends its job's exception back pickled: one that cannot be rebuilt
    made loky call its pool broken and SIGKILL the other workers, jobs still writing."""
    import pickle

    from paged_bench.cli.signals import Terminated

    back = pickle.loads(pickle.dumps(Terminated(signal.SIGTERM)))
    assert isinstance(back, KeyboardInterrupt) and back.signum == signal.SIGTERM and str(back) == "SIGTERM"


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_signal_while_a_run_is_written_waits_for_the_files(config, tmp_path, replicas):
    """Ctrl-C as the engine's figures are being written (one engine, or a cluster of two):
    the files are written whole, the run ends as it did (here every request finished), and
    the signal is noted for the CLI."""
    from paged_bench.cli import signals
    from paged_bench.cluster import cluster_job
    from paged_bench.run import job as app

    cfg = config("workload.num_requests=20", "tracking.enabled=false", f"cluster.replicas={replicas}")

    def scenario() -> None:
        module, name = (app, "write_run") if replicas == 1 else (cluster_job, "write_cluster_run")
        write = getattr(module, name)

        def interrupted_write(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)  # delivered at the next bytecode, mid-write
            time.sleep(0.05)
            return write(*args, **kwargs)

        setattr(module, name, interrupted_write)
        try:
            with signals.stop_on_signals(signals.WITH_CTRL_C):
                outcome = app.run_job(cfg, tmp_path, shield=signals.deferred)
        except signals.Terminated:
            raise AssertionError("the signal cut the writing short") from None
        assert signals.received() == signal.SIGINT
        assert outcome.status == "finished" and json.loads((tmp_path / "summary.json").read_text())["completed"] == 20
        assert (tmp_path / "requests.csv").is_file() and (tmp_path / "run_info.json").is_file()

    in_a_child(scenario)


def test_a_worker_notes_a_signal_between_jobs_instead_of_exiting():
    """Raised in loky's wait for the next job, a signal would end the worker, and loky would
    SIGKILL the others; noted, it only stops the worker from starting another job."""
    from paged_bench.cli import signals

    def noted() -> None:
        signals.note_between_jobs()
        os.kill(os.getpid(), signal.SIGTERM)  # between two jobs of the worker
        time.sleep(0.05)
        assert signals.received() == signal.SIGTERM  # noted, not raised

    def raised_in_a_job() -> None:
        signals.note_between_jobs()
        with pytest.raises(signals.Terminated), signals.stop_on_signals(signals.WITH_CTRL_C):
            os.kill(os.getpid(), signal.SIGINT)  # inside a job it stops the job
            time.sleep(0.05)

    in_a_child(noted)
    in_a_child(raised_in_a_job)


def test_a_stopped_sweep_withdraws_the_jobs_that_never_began(tmp_path):
    """A launcher hands a job out as the sweep stops: Hydra made its folder, the job wrote
    nothing. It is removed (counted as not run); a job that began is recorded interrupted."""
    from paged_bench.cli import sweep_folder

    never, began = tmp_path / "2", tmp_path / "1"
    for run_dir in (never, began):
        (run_dir / ".hydra").mkdir(parents=True)
        (run_dir / ".hydra" / "config.yaml").write_text("max_batch: 16\n")
        (run_dir / "__main__.log").write_text("")
    (began / "run_info.json").write_text(json.dumps({"run_name": "max_batch=8", "job_num": 1}))
    sweep_folder.record_unfinished(tmp_path, "was stopped")
    assert not never.exists()
    info = json.loads((began / "run_info.json").read_text())
    assert info["status"] == "interrupted" and info["run_name"] == "max_batch=8"


def test_a_signal_noted_as_a_job_starts_stops_it_on_entry():
    """Noted between the worker's check and the job's own handlers, a signal would otherwise
    let the job run to its end, unstoppable, until the launcher kills it."""
    from paged_bench.cli import signals

    def noted_then_a_job() -> None:
        signals.note_between_jobs()
        os.kill(os.getpid(), signal.SIGINT)  # noted, as the worker hands the job on
        time.sleep(0.05)
        with pytest.raises(signals.Terminated), signals.stop_on_signals(signals.WITH_CTRL_C):
            raise AssertionError("the job ran")

    in_a_child(noted_then_a_job)


def test_a_job_stopped_before_its_engine_ran_says_nothing_was_measured(monkeypatch, config, tmp_path):
    from omegaconf import OmegaConf

    from paged_bench.cli import hydra_job as job_module
    from paged_bench.cli import signals

    def building(*args, **kwargs):
        raise signals.Terminated(signal.SIGTERM)  # as the handler does while the engine is built

    monkeypatch.setattr(job_module, "run_job", building)
    monkeypatch.setattr(job_module.Job, "current", classmethod(
        lambda cls: job_module.Job(run_dir=tmp_path, multirun=False, sweep_dir=None, num=None, name="default")))  # fmt: skip
    with pytest.raises(signals.Terminated):
        job_module.run(OmegaConf.create(config("tracking.enabled=false")))
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert info["status"] == "interrupted"
    assert info["error"] == "interrupted by SIGTERM before the engine ran: nothing was measured"


LATE_SIGNAL = """
import os, signal, sys
from paged_bench.cli import sweep
from paged_bench.__main__ import cli

build_report = sweep.build_report
def late(*args, **kwargs):  # Ctrl-C lands as the sweep's report is built, after the last job ended
    os.kill(os.getpid(), signal.SIGINT)
    return build_report(*args, **kwargs)
sweep.build_report = late
sys.argv = ["paged_bench", *sys.argv[1:]]
cli()
"""


def test_a_signal_after_the_last_job_says_nothing_was_cut_short(tmp_path):
    # it exited 130, "interrupted", while the parent was closed FINISHED with every figure
    uri = fresh_store(tmp_path)
    proc = subprocess.run([sys.executable, "-c", LATE_SIGNAL, "-m", "max_batch=2,4"], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("note: SIGINT came after the sweep's last job had ended: the sweep "
                                                    "was closed as it ended, nothing was cut short")  # fmt: skip
    assert "2 job(s), 0 not finished" in proc.stdout
    parent, children = _split(runs_of(uri, "paged_bench")[1])
    assert parent.info.status == "FINISHED" and [r.info.status for r in children] == ["FINISHED"] * 2
