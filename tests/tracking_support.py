"""Helpers for the tracking, sweep, report and plugin tests: a migrated MLflow store made once
per test session and copied per test (migrating a new SQLite store costs seconds), the CLI in
a subprocess, and reading what a run logged."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import paged_bench.tracking  # noqa: F401  (telemetry off before mlflow is imported)


@functools.cache
def _migrated_store() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="pb-mlflow-"))
    atexit.register(shutil.rmtree, folder, True)
    db = folder / "mlflow.db"
    from mlflow import MlflowClient

    MlflowClient(f"sqlite:///{db}").search_experiments()  # runs the migrations
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
        import time
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
