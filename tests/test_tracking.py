"""MLflow tracking: what a run logs (params, metrics = summary.json keys, step series, tags,
artifacts) to the default store under runs/, a store that fails (warn once, results kept,
exit 0), and an interrupted run (KILLED, never RUNNING)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from paged_bench.report.load import load_run
from paged_bench.tracking import store
from paged_bench.tracking.runs import PREEMPTIONS_SERIES, STEP_SERIES, params_of, rounded, step_metrics, upload_run
from tests.tracking_support import artifact_paths, call_cli, cli_env, client, fresh_store, runs_of


def _run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("runs/20*/*/run_info.json"))


def test_a_run_logs_its_config_summary_steps_and_files_to_the_default_store(tmp_path):
    uri = fresh_store(tmp_path)  # where the CLI looks when MLFLOW_TRACKING_URI is unset
    proc = call_cli(tmp_path, "max_batch=8", "scheduler=static", "tracking.step_metrics=100000")  # every step
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    (run_dir,) = _run_dirs(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())

    c, runs = runs_of(uri, "paged_bench")
    (run,) = runs
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "max_batch=8 scheduler=static"  # the store settings (tracking.*) are no part of it
    assert run.info.artifact_uri.startswith(f"file://{tmp_path}/runs/mlartifacts/")
    # params: the resolved config, flattened
    params = run.data.params
    assert params["scheduler.name"] == "static" and params["max_batch"] == "8" and params["scheduler.max_batch"] == "8"
    assert params["allocator.name"] == "paged" and params["block_size"] == "16" and params["backend.name"] == "sim"
    assert params["workload.rate"] == "25.0" and params["seed"] == "0" and params["num_blocks"] == "null"
    assert not any(k.startswith("tracking.") for k in params)
    # metrics: exactly summary.json's non-null keys (plus the step series), same values
    logged = {k: v for k, v in run.data.metrics.items() if not k.startswith("step/")}
    assert logged == {k: rounded(v) for k, v in summary.items() if v is not None}  # 6 significant digits
    assert logged == pytest.approx({k: float(v) for k, v in summary.items() if v is not None}, rel=1e-5)
    assert len(repr(logged["mean_ttft_ms"])) <= 8 < len(repr(summary["mean_ttft_ms"]))
    # step series: one point per engine step, step = its index
    steps = (run_dir / "steps.csv").read_text().splitlines()[1:]
    history = c.get_metric_history(run.info.run_id, "step/batch_size")
    assert len(history) == len(steps) and [m.step for m in history] == list(range(len(steps)))
    batch_col = (run_dir / "steps.csv").read_text().splitlines()[0].split(",").index("batch_size")
    assert [m.value for m in history] == [float(row.split(",")[batch_col]) for row in steps]
    assert {"step/queue_length", "step/kv_live_slots", "step/kv_reserved_slots", PREEMPTIONS_SERIES} <= set(
        run.data.metrics
    )
    # tags and artifacts
    tags = run.data.tags
    assert tags["experiment"] == "paged_bench" and tags["host"] and tags["status"] == "finished"
    assert len(tags.get("git_commit", "0" * 40)) == 40
    assert tags["run_dir"] == str(run_dir)
    release = f"paged-bench=={version('paged-bench')}"  # the code that ran each plugin
    assert {k: v for k, v in tags.items() if k.startswith("package.")} == {
        f"package.{kind}": release for kind in ("workload", "scheduler", "allocator", "backend")
    }
    assert json.loads((run_dir / "run_info.json").read_text())["plugin_packages"]["scheduler"] == release
    assert {"summary.json", "requests.csv", "steps.csv", "run_info.json", "config.yaml", "plots"} <= artifact_paths(
        c, run.info.run_id
    )
    assert {"plots/kv_over_time.png", "plots/ttft_cdf.png"} <= artifact_paths(c, run.info.run_id, "plots")


def test_tracking_can_be_turned_off(tmp_path):
    proc = call_cli(tmp_path, "tracking.enabled=false")
    assert proc.returncode == 0, proc.stderr
    assert _run_dirs(tmp_path) and not (tmp_path / "runs" / "mlflow.db").exists()


@pytest.mark.parametrize("broken", ["unreachable", "not_a_database", "a_folder"])
def test_a_failing_store_warns_once_and_keeps_the_results(tmp_path, broken):
    if broken == "unreachable":
        uri = "http://127.0.0.1:9"  # discard port: nothing listens
    elif broken == "not_a_database":
        (tmp_path / "garbage.db").write_text("this is not an SQLite database\n" * 100)
        uri = f"sqlite:///{tmp_path / 'garbage.db'}"
    else:  # one SQLite cannot open: MLflow alone would retry it for ~100 s
        (tmp_path / "folder.db").mkdir()
        uri = f"sqlite:///{tmp_path / 'folder.db'}"
    started = time.monotonic()
    proc = call_cli(tmp_path, MLFLOW_TRACKING_URI=uri, MLFLOW_HTTP_REQUEST_MAX_RETRIES="0")
    assert time.monotonic() - started < 30, "the store took long to fail"
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning: MLflow tracking failed") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    (run_dir,) = _run_dirs(tmp_path)
    assert json.loads((run_dir / "summary.json").read_text())["completed"] == 48
    assert str(run_dir) in proc.stderr  # the warning says where the results are
    assert "requests completed" in proc.stdout  # the summary table was printed
    if broken != "unreachable":
        assert "cannot open the SQLite store" in proc.stderr, proc.stderr  # which store, and why


def _cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_inside_engine(root: Path, cpu_s: float = 0.25) -> None:
    """Until the run recorded its process (as it starts to build its engine) and used ``cpu_s``
    of CPU since: its engine (~0.06 s of CPU to build) has run ~0.2 s, some 80,000 steps.
    CPU time, not a sleep: a loaded machine makes it slower, not wrong, and the run's files
    as large."""
    deadline, pid, since = time.monotonic() + 120, None, 0.0
    while time.monotonic() < deadline:
        if pid is None:
            for info in root.glob("runs/20*/*/run_info.json"):
                with contextlib.suppress(ValueError):  # being written
                    pid = json.loads(info.read_text()).get("pid")
            since = _cpu_s(pid) if pid is not None else 0.0
        elif _cpu_s(pid) - since >= cpu_s:
            return
        time.sleep(0.02)
    raise AssertionError("the run did not start its engine")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads the run's CPU time from /proc")
def test_ctrl_c_marks_the_run_killed_and_keeps_what_was_measured(tmp_path):
    """On the simulator's virtual clock: the compiled engine loop stops on Ctrl-C too."""
    uri = fresh_store(tmp_path)
    # 1.6 million one-sequence steps: seconds on the sim, so the signal lands inside the run
    args = ["workload.num_requests=4000", "workload.output_len=400", "max_model_len=1024", "max_batch=1"]
    proc = subprocess.Popen([sys.executable, "-m", "paged_bench", *args], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    _wait_inside_engine(tmp_path)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    (run_dir,) = [p.parent for p in tmp_path.glob("runs/20*/*/config.yaml")]
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "interrupted"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 < summary["completed"] < 4000  # what finished before Ctrl-C is kept
    _, (run,) = runs_of(uri, "paged_bench")
    assert run.info.status == "KILLED" and run.data.tags["status"] == "interrupted"
    assert run.data.metrics["completed"] == summary["completed"]


# -- the pieces, in-process -------------------------------------------------------------------


def _steps(n: int, preempt_at: tuple[int, ...] = ()) -> list[dict]:
    """steps.csv rows as csv.DictReader gives them: read by column name."""
    return [{"step": str(i), "time": str(0.01 * (i + 1)), "batch_size": str(i % 7), "waiting": "0",
             "kv_live_slots": "0", "kv_reserved_slots": "0", "preemptions": "1" if i in preempt_at else "0"}
            for i in range(n)]  # fmt: skip


def test_step_series_are_thinned_without_losing_preemptions_or_the_last_step():
    steps = _steps(1000, preempt_at=(3, 5, 998))
    metrics = step_metrics(steps, start_ms=1_000_000, max_points=100)
    series = {name: [m for m in metrics if m.key == name] for name in [*STEP_SERIES.values(), PREEMPTIONS_SERIES]}
    # at most max_points, as tracking.step_metrics says: every 10th step to 980, then the last
    assert all(len(points) == 100 for points in series.values())
    assert step_metrics(steps, 0, 1)[-1].step == 999 and len(step_metrics(steps, 0, 1)) == len(series)
    assert series[PREEMPTIONS_SERIES][-1].value == 3 and series[PREEMPTIONS_SERIES][-1].step == 999
    batch = series["step/batch_size"]
    assert [m.step for m in batch[:3]] == [0, 10, 20] and [m.value for m in batch[:3]] == [0.0, 3.0, 6.0]
    assert batch[1].timestamp == 1_000_000 + 110  # the run's clock: step 10 ended at 0.11 s
    assert step_metrics(steps, 0, 0) == [] and step_metrics([], 0, 100) == []
    assert len([m for m in step_metrics(_steps(50), 0, 100) if m.key == "step/batch_size"]) == 50


def test_params_flatten_the_config_and_leave_out_the_store():
    params = params_of({"scheduler": {"name": "sjf", "noise": 0.5}, "slo": {"ttft_ms": None},
                        "report": {"metrics": ["a", "b"]}, "tracking": {"uri": "http://user:secret@host"}})  # fmt: skip
    assert params == {
        "scheduler.name": "sjf",
        "scheduler.noise": "0.5",
        "slo.ttft_ms": "null",
        "report.metrics": '["a", "b"]',
    }


def test_the_store_is_absolute_and_the_environment_overrides_the_default(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert store.resolve_uri() == f"sqlite:///{tmp_path}/runs/mlflow.db"
    assert store.artifact_root(store.resolve_uri()) == tmp_path / "runs" / "mlartifacts"
    assert store.resolve_uri("sqlite:///rel/x.db") == f"sqlite:///{tmp_path}/rel/x.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert store.resolve_uri() == "http://127.0.0.1:5000" and store.artifact_root("http://127.0.0.1:5000") is None
    assert store.resolve_uri("sqlite:////abs/y.db") == "sqlite:////abs/y.db"  # tracking.uri beats the environment


def test_a_job_that_failed_is_logged_failed_with_its_error(tmp_path):
    uri = fresh_store(tmp_path)
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("max_batch: -1\nexperiment_name: unit\n")
    (run_dir / "run_info.json").write_text(json.dumps({"status": "failed", "error": "max_batch=-1 is not allowed",
                                                       "run_name": "max_batch=-1", "start_time": time.time()}))
    c = client(uri)
    run_id = upload_run(c, c.create_experiment("unit", artifact_location=str(tmp_path / "artifacts")), run_dir, {})
    run = c.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["error"] == "max_batch=-1 is not allowed"
    assert run.info.run_name == "max_batch=-1" and run.data.tags["paged_bench.uploaded"] == "true"
    assert run.data.params == {"max_batch": "-1", "experiment_name": "unit"} and run.data.metrics == {}
    assert artifact_paths(c, run_id) == {"config.yaml", "run_info.json"}
    # a job killed (SIGKILL) left its start record only: FAILED with no error tag, "failed: None" in reports
    (run_dir / "run_info.json").write_text(json.dumps({"run_name": "killed", "start_time": time.time(), "pid": 1}))
    killed = c.get_run(upload_run(c, c.get_experiment_by_name("unit").experiment_id, run_dir, {}))
    assert killed.info.status == "FAILED"
    assert killed.data.tags["error"].startswith("no results: the job stopped before it wrote any (its process was killed")
    assert load_run(run_dir).error == killed.data.tags["error"]


def test_sim_runs_do_not_log_the_roofline_options_the_linear_model_ignores():
    sim = {"name": "sim", "cost_model": "linear", "step_overhead_ms": 3.0, "hardware": "h100",
           "model": {"preset": "llama-3-8b", "num_layers": 2}, "dtype": None, "preset": None}  # fmt: skip
    params = params_of({"backend": sim})
    assert params == {"backend.name": "sim", "backend.cost_model": "linear", "backend.step_overhead_ms": "3.0",
                      "backend.preset": "null"}  # fmt: skip
    roofline = params_of({"backend": {**sim, "cost_model": "roofline", "engine_cpu": "vllm_v0", "all_reduce": "nccl"}})
    assert roofline["backend.hardware"] == "h100" and roofline["backend.model.num_layers"] == "2"
    # the measured model's options: the roofline ignores them
    assert "backend.engine_cpu" not in roofline and "backend.all_reduce" not in roofline
    measured = params_of({"backend": {**sim, "cost_model": "measured", "engine_cpu": "none", "all_reduce": "nccl"}})
    assert measured["backend.engine_cpu"] == "none" and measured["backend.hardware"] == "h100"
    assert measured["backend.all_reduce"] == "nccl"
    assert params_of({"backend": {"name": "torch", "model": "small"}}) == {"backend.name": "torch",
                                                                           "backend.model": "small"}  # fmt: skip


def test_a_job_on_another_host_logs_itself_under_the_sweeps_parent(tmp_path, monkeypatch):
    """SLURM or a Ray cluster: the job's machine is not the sweep's, so the job logs itself."""
    from paged_bench.cli.track import track_job
    from paged_bench.report.load import save_config, update_run_info
    from paged_bench.run.job import run_job
    from paged_bench.run.tracking_settings import TrackingSettings
    from paged_bench.tracking import uploader
    from tests.conftest import compose_config

    monkeypatch.setenv("PAGED_BENCH_TRACKING_IDLE_S", "20")
    uri = fresh_store(tmp_path)
    c = client(uri)
    exp = c.create_experiment("paged_bench", artifact_location=str(tmp_path / "artifacts"))  # not ./mlruns
    parent = c.create_run(exp, tags={"paged_bench.kind": "sweep"}).info.run_id
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    link = {"uri": uri, "experiment_id": exp, "run_id": parent}
    (sweep_dir / "sweep.json").write_text(json.dumps({"host": "another-node", "pid": 1, "tracking": link}))
    config = compose_config("max_batch=4", "workload.num_requests=8")
    run_dir = sweep_dir / "0"
    save_config(run_dir, config)
    run_job(config, run_dir)
    update_run_info(run_dir, {"run_name": "max_batch=4", "job_num": 0, "start_time": time.time()})
    store.reset_failure()
    track_job(TrackingSettings.from_config(config), run_dir, sweep_dir)
    uploader.close_shared()
    assert store.failure() is None
    (child,) = [r for r in c.search_runs([exp]) if r.info.run_id != parent]
    assert child.data.tags["mlflow.parentRunId"] == parent and child.info.run_name == "max_batch=4"
    assert child.info.status == "FINISHED" and child.data.metrics["completed"] == 8


def test_the_helpers_socket_appears_only_once_it_listens(tmp_path, monkeypatch):
    """bind makes a Unix socket's file before listen; a command that saw it then was refused. The
    helper binds under another name and takes the socket's only once it listens."""
    import socket

    from paged_bench.tracking.helper import Server

    path = tmp_path / "h.sock"
    server = Server(path, idle_s=60)
    seen, listen = [], socket.socket.listen
    monkeypatch.setattr(socket.socket, "listen", lambda sock, n: (seen.append(path.exists()), listen(sock, n))[1])
    server.bind()
    assert seen == [False] and path.exists() and not server.staging.exists()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))  # accepted (queued) as soon as the file is there
    server.sock.close()


@pytest.mark.parametrize("when", ["while it imports mlflow", "once it answers"])
def test_a_terminated_tracking_helper_leaves_no_socket(tmp_path, when):
    import socket

    path = tmp_path / "h.sock"
    helper = subprocess.Popen([sys.executable, "-m", "paged_bench.tracking.helper", "--socket", str(path)],
                              env=cli_env(), stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    if when == "once it answers":
        with socket.socket(socket.AF_UNIX) as sock, sock.makefile("r") as reader:
            sock.connect(str(path))
            sock.sendall(b'{"op": "ping"}\n')
            assert json.loads(reader.readline()) == {"pid": helper.pid}
    helper.send_signal(signal.SIGTERM)
    assert helper.wait(timeout=60) == 0, helper.stderr.read()
    assert not path.exists()  # it stayed behind, and every later command first failed to connect to it
