"""Helpers for the tracking, sweep, report and plugin tests: a migrated MLflow store made once
per test session and copied per test (migrating a new SQLite store costs seconds), the CLI
in-process (``call_cli``: as a fresh process would run it, for the tests whose point is not the
process boundary) or in a subprocess (``run_cli``), and reading what a run logged."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paged_bench.tracking  # noqa: F401  (telemetry off before mlflow is imported)

SESSION_FOLDER: Path | None = None  # under pytest -n: the session's folder all its workers share (conftest)


@functools.cache
def _migrated_store() -> Path:
    """Made once per test session (the workers of one ``pytest -n`` run share it: the first
    makes it, under a lock, the others wait for it)."""
    if SESSION_FOLDER is None:
        folder = Path(tempfile.mkdtemp(prefix="pb-mlflow-"))
        atexit.register(shutil.rmtree, folder, True)
    else:  # pytest removes it with the session's other temporary folders
        folder = SESSION_FOLDER / "mlflow-store"
        folder.mkdir(exist_ok=True)
    db = folder / "mlflow.db"
    with (folder / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not db.exists():
            from mlflow import MlflowClient

            made = folder / "making.db"
            MlflowClient(f"sqlite:///{made}").search_experiments()  # runs the migrations
            made.rename(db)
    return db


def fresh_store(folder: Path) -> str:
    """A migrated store at ``folder/runs/mlflow.db`` (where the CLI looks by default); its URI."""
    db = folder / "runs" / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(_migrated_store(), db)
    return f"sqlite:///{db}"


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "HYDRA_"))}
    env["PAGED_BENCH_TRACKING_IDLE_S"] = "20"  # the tracking helper the tests start goes soon after them
    # as importing paged_bench.tracking sets it: a command in-process and one in a subprocess
    # then share one tracking helper (its key counts the MLFLOW_ settings)
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env.update(extra)
    return env


def run_cli(cwd: Path, *args: str, module: str = "paged_bench", timeout: float = 240, **env: str):
    """``python -m paged_bench ARGS`` in ``cwd`` (its runs/ land there)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Ran:
    """What a command did, as ``subprocess.run`` reports it."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


# a fresh interpreter's warning filters (pytest's own are "always"): what a user of the command sees
_FRESH_FILTERS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                  ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                  ("ignore", ResourceWarning, ""))  # fmt: skip


IN_PROCESS = ("paged_bench", "paged_bench.tracking.sync", "paged_bench.report", "paged_bench.serve",
              "paged_bench.plan")  # call_cli's  # fmt: skip


def _entry(module: str):
    """``python -m MODULE``'s main, called in-process: returns its exit status or raises SystemExit."""
    if module == "paged_bench":
        from paged_bench.__main__ import cli

        return cli
    if module == "paged_bench.tracking.sync":
        from paged_bench.tracking.sync import main

        return main
    if module == "paged_bench.report":
        from paged_bench.report.__main__ import main

        return main
    if module == "paged_bench.validate":
        from paged_bench.validate.__main__ import main as validate

        return validate
    if module == "paged_bench.serve":
        from paged_bench.serve.__main__ import cli as serve

        return serve
    if module == "paged_bench.plan":
        from paged_bench.capacity.app import cli as plan

        return plan
    raise ValueError(f"call_cli runs paged_bench, its sync, report, serve and plan; {module}: use run_cli")


def call_cli(cwd: Path, *args: str, module: str = "paged_bench", **env: str) -> Ran:
    """``python -m MODULE ARGS`` in ``cwd``, run in this process as a fresh process would run it:
    its environment (``cli_env``), its argv, its stdout and stderr (what it prints, the warnings
    a user would see), its exit status; the process-wide state it sets (signal handlers,
    Hydra's, logging, the tracking helper's connection, a failed store) put back afterwards.
    For tests whose point is what a command does, not that it is a process of its own (signals,
    a worker left behind, the plugins a new interpreter finds on PYTHONPATH: ``run_cli``)."""
    if "PYTHONPATH" in env:
        raise ValueError("a PYTHONPATH takes a new interpreter: use run_cli")
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from paged_bench.cli import signals, sweep
    from paged_bench.tracking import store, uploader

    main = _entry(module)
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    handlers = {s: signal.getsignal(s) for s in handled}
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    root = logging.getLogger()
    saved_log = (root.level, root.handlers[:])
    out, err = io.StringIO(), io.StringIO()
    assert signals.received() is None, "a signal is pending in the test's process"
    os.environ.clear()
    os.environ.update(cli_env(**env))
    os.chdir(cwd)
    sys.argv = [str(Path(main.__code__.co_filename)), *args]
    store.reset_failure()
    sweep.forget_last()
    GlobalHydra.instance().clear()
    code: int | str | None = 0
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.resetwarnings()
            for action, category, where in reversed(_FRESH_FILTERS):
                warnings.filterwarnings(action, category=category, module=where)
            warnings.showwarning = _show_on_stderr
            try:
                no_argv = module in ("paged_bench", "paged_bench.serve", "paged_bench.plan")  # they read sys.argv
                code = main() if no_argv else main(list(args))
            except SystemExit as e:
                code = e.code
            finally:
                uploader.close_shared()  # as the process's exit does: waits for the helper
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None
        for h in root.handlers:
            if h not in saved_log[1]:
                h.close()  # Hydra's: the job's .log file, written whole
        root.setLevel(saved_log[0])
        root.handlers[:] = saved_log[1]
        for s, handler in handlers.items():
            signal.signal(s, handler)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        store.reset_failure()
    status = code if isinstance(code, int) else (0 if code is None else 1)
    if isinstance(code, str):  # sys.exit("message"): printed on stderr, status 1
        err.write(code + "\n")
    return Ran([module, *args], status, out.getvalue(), err.getvalue())


def _show_on_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def in_a_child(scenario: Callable[[], object]) -> None:
    """Run ``scenario()`` (its asserts) in a child of this process, forked (nothing to import
    again): what it changes in the process (signal handlers, a signal noted, a sweep begun, its
    environment) stays there. Its failure is its traceback, in the test's captured stderr."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            scenario()
            status = 0
        except BaseException:  # noqa: BLE001  (reported, whatever it is)
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the scenario failed in a child process: see its stderr"


def sweep_config(sweep_dir: Path, *overrides: str):
    """The config Hydra hands a sweep's start (``cli.sweep.start``): ``python -m paged_bench -m
    OVERRIDES hydra.sweep.dir=SWEEP_DIR``'s, untracked."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("paged_bench.conf", version_base="1.3"):
        return compose("config", overrides=[*overrides, "tracking.enabled=false", f"hydra.sweep.dir={sweep_dir}"],
                       return_hydra_config=True)  # fmt: skip


# a run paced in real time (clock=wall): long in wall time at little CPU (a step is a ~4 ms sleep,
# a request ends every ~0.1 s), so that a signal lands inside its engine loop, and what it
# measured until then (a few hundred steps) is quickly written, plotted and logged
PACED = ("clock=wall", "workload.num_requests=2000", "workload.output_len=20")
SETTLE_S = 1.5  # after a job recorded its process: its engine built (~0.1 s of CPU), requests done


def wait_for_jobs(root: Path, pattern: str, count: int = 1) -> None:
    """Until ``count`` jobs (``run_info.json`` files under ``root`` matching ``pattern``)
    recorded their process, which a job does as it starts to build its engine, then
    ``SETTLE_S`` more: each paced job is inside its engine loop and has measured something."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        started = 0
        for info in root.glob(pattern):
            with contextlib.suppress(ValueError):  # being written
                started += "pid" in json.loads(info.read_text())
        if started >= count:
            time.sleep(SETTLE_S)
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} job(s) did not start")


def runs_of(uri: str, experiment: str):
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r}"
    return c, c.search_runs([exp.experiment_id], max_results=1000)


def artifact_paths(c, run_id: str, path: str | None = None) -> set[str]:
    return {a.path for a in c.list_artifacts(run_id, path)}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real ``mlflow server`` on a free loopback port, its store and artifacts in ``folder``;
    ``stop`` kills it (as a crashed server), ``start`` brings it back on the same port and store."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.store = fresh_store(folder)  # folder/runs/mlflow.db, migrated already
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> MlflowServer:
        import urllib.request

        args = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.store,
                "--artifacts-destination", str(self.folder / "server-artifacts"), "--host", "127.0.0.1",
                "--port", str(self.port), "--workers", "1"]  # fmt: skip
        env = cli_env(MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        self.proc = subprocess.Popen(args, cwd=self.folder, env=env, stdout=subprocess.DEVNULL,
                                     stderr=(self.folder / "server.log").open("a"), start_new_session=True)  # fmt: skip
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
            if self.proc.poll() is not None:
                break
        raise RuntimeError(f"mlflow server did not start: {(self.folder / 'server.log').read_text()[-2000:]}")

    def stop(self) -> None:
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the server and its workers, as a crash would
            self.proc.wait()
        self.proc = None
