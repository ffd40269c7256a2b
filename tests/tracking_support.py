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
