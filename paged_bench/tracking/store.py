"""Where runs are logged: the tracking URI, the MLflow client and experiment, and the rule
that a failing store warns once and is then left alone for the rest of the process."""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import paged_bench.tracking  # noqa: F401  (telemetry off before mlflow is imported)

RUNS_DIR = "runs"
DB_FILE = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"
# an unreachable server should cost seconds, not MLflow's default of minutes of retries
# (mlflow reads the retry settings as integers: "0.5" would fail every HTTP call)
_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # one bar per small file is noise
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # a server's run links are not our output
}

_failure: str | None = None  # why tracking stopped in this process, once it has


def default_uri(base: Path | None = None) -> str:
    return f"sqlite:///{(base or Path.cwd()).resolve() / RUNS_DIR / DB_FILE}"


def resolve_uri(configured: str | None = None) -> str:
    """``configured`` (tracking.uri), else ``$MLFLOW_TRACKING_URI``, else the embedded store;
    a relative SQLite path is made absolute (jobs may run from other directories)."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or default_uri()
    path = sqlite_path(uri)
    return f"sqlite:///{path}" if path is not None else uri


def sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    raw = uri[len("sqlite:///") :]
    return Path(raw).resolve() if raw and raw != ":memory:" else None


def artifact_root(uri: str) -> Path | None:
    """Artifacts of an SQLite store go beside it (absolute); a server picks its own."""
    path = sqlite_path(uri)
    return path.parent / ARTIFACTS_DIR if path is not None else None


def client(uri: str) -> Any:
    """The ``MlflowClient`` for ``uri``, one per process (a new SQLite store object checks its
    schema again), or a new one when the SQLite file was replaced (``rm -rf runs``)."""
    path = sqlite_path(uri)
    if path is not None and not path.exists():
        _new_client(uri).search_experiments(max_results=1)  # creates the file and its tables
    return _client(uri, path.stat().st_ino if path is not None else None)


@functools.lru_cache(maxsize=8)
def _client(uri: str, identity: int | None) -> Any:
    return _new_client(uri)


def _new_client(uri: str) -> Any:
    for key, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    path = sqlite_path(uri)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _forget_engine(uri)
    from mlflow import MlflowClient

    for name in ("mlflow", "alembic"):  # a new store's migrations log at INFO: not our user's concern
        logging.getLogger(name).setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


def _forget_engine(uri: str) -> None:
    """MLflow keeps one store and one database engine per URI for the process; those opened
    on a file that has since been deleted write into nothing, so a replaced file gets new ones
    (MLflow has no public way to say so: its caches are cleared where they are, if they are)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service import utils

    engine = getattr(SqlAlchemyStore, "_engine_map", {}).pop(uri, None)
    if engine is not None:
        engine.dispose()
    stores = getattr(utils._tracking_store_registry, "_get_store_with_resolved_uri", None)
    if hasattr(stores, "cache_clear"):
        stores.cache_clear()


def experiment_id(mlflow_client: Any, name: str, uri: str) -> str:
    """The id of experiment ``name``, created (with an absolute artifact location) if new."""
    from mlflow.exceptions import MlflowException

    exp = mlflow_client.get_experiment_by_name(name)
    if exp is None:
        root = artifact_root(uri)
        location = (root / re.sub(r"[^\w.-]", "_", name)).as_uri() if root is not None else None
        try:
            return mlflow_client.create_experiment(name, artifact_location=location)
        except MlflowException:  # another job of the sweep created it first
            exp = mlflow_client.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        mlflow_client.restore_experiment(exp.experiment_id)
    return exp.experiment_id


def failure() -> str | None:
    """Why tracking is off in this process, if a store failed."""
    return _failure


def report_failure(error: BaseException, where: str) -> None:
    """Warn once per process; later jobs skip tracking instead of failing (and waiting) again."""
    global _failure
    if _failure is not None:
        return
    first = (str(error).strip().splitlines() or [""])[0][:300]
    _failure = first if getattr(error, "names_its_cause", False) else f"{type(error).__name__}: {first}"
    print(f"warning: MLflow tracking failed ({_failure}); tracking is off for this process, "
          f"the results are on disk in {where} (python -m paged_bench.sync uploads them)", file=sys.stderr)  # fmt: skip


def reset_failure() -> None:
    """For tests: forget an earlier failure."""
    global _failure
    _failure = None
