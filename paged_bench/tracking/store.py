"""Where runs are logged: the tracking URI (and which ones MLflow opens), the MLflow client
and experiment, and the rule that a failing store warns once and is then left alone for the
rest of the process."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import paged_bench.tracking  # noqa: F401  (telemetry off before mlflow is imported)
from paged_bench.errors import check, one_line
from paged_bench.results.whole_files import folder_name

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

URI_ENV = "MLFLOW_TRACKING_URI"
URI_FORMS = "sqlite:///PATH, http(s)://HOST:PORT, databricks, or a database URL such as postgresql://..."
# MLflow 3 refuses its file store (a bare path or file://) unless this is true
FILE_STORE_ENV = "MLFLOW_ALLOW_FILE_STORE"

# the experiment's kind, which the MLflow UI reads where its GenAI / ML switch is off: the classic
# ML pages (runs table, charts), not GenAI's traces and evaluations (tracking/ui.py)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
CLASSIC_KIND = "custom_model_development"

_failure: str | None = None  # why tracking stopped in this process, once it has


class StoreError(Exception):
    """A store that cannot be opened; the message names it and says why."""

    names_its_cause = True


def default_uri(base: Path | None = None) -> str:
    return f"sqlite:///{(base or Path.cwd()).resolve() / RUNS_DIR / DB_FILE}"


def resolve_uri(configured: str | None = None) -> str:
    """``configured`` (tracking.uri), else ``$MLFLOW_TRACKING_URI``, else the embedded store;
    a relative path (SQLite's, a file store's) is made absolute (jobs, and the tracking helper,
    run from other directories)."""
    uri = configured or os.environ.get(URI_ENV) or default_uri()
    path = sqlite_path(uri)
    if path is not None:
        return f"sqlite:///{path}"
    return Path(uri).resolve().as_uri() if _is_file_store(uri) and not urlparse(uri).scheme else uri  # a folder


def recorded_uri(configured: Any = None) -> str:
    """The store a run or sweep is meant for, as its folder records it (``sync`` uploads it
    there, and to no other store unless told to): ``resolve_uri``'s, less a user name and password
    that came from ``$MLFLOW_TRACKING_URI`` (a run's files go to the store with it; those in
    ``tracking.uri`` are in its ``config.yaml`` already). Not a URI (an untracked run's
    ``tracking.uri`` is not checked): as if none was named."""
    if isinstance(configured, str) and configured.strip():
        return resolve_uri(configured)
    return without_credentials(resolve_uri())


def without_credentials(uri: str) -> str:
    """``uri`` less its user name and password: ``https://user:pw@host`` -> ``https://host``."""
    parts = urlparse(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunparse(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def same_store(a: str, b: str) -> bool:
    """Whether two URIs name one store: SQLite and file stores by their absolute path, others
    by scheme, host and path, whatever the case of the host, a trailing slash or credentials
    (``http://127.0.0.1:5000/`` is ``http://user@127.0.0.1:5000``)."""
    return _identity(a) == _identity(b)


def _identity(uri: str) -> str:
    uri = resolve_uri(uri)
    path = sqlite_path(uri)
    if path is not None:
        return f"sqlite:///{path}"
    parts = urlparse(without_credentials(uri))
    return urlunparse((parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"), parts.params,
                       parts.query, ""))  # fmt: skip


# what MLflow's tracking-store registry opens (mlflow/tracking/_tracking_service/utils.py):
# ftp://x passed, and the run's tracking failed after it, naming the model registry
_DATABASES = ("postgresql", "mysql", "sqlite", "mssql")  # and their dialects, postgresql+psycopg2


@functools.cache
def _tracking_schemes() -> frozenset[str]:
    from importlib.metadata import entry_points

    plugins = {ep.name for ep in entry_points(group="mlflow.tracking_store")}
    return frozenset({"", "file", "databricks", "databricks-uc", "uc", "http", "https", *plugins})


def check_uri(configured: Any, key: str) -> None:
    """Refuse, before anything runs, a store that MLflow would refuse once the run is over:
    ``configured`` (named ``key`` in the message), else ``$MLFLOW_TRACKING_URI`` when set."""
    uri = configured
    if uri in (None, ""):
        uri, key = os.environ.get(URI_ENV) or None, URI_ENV
    if uri is None:
        return  # the embedded SQLite store
    check(isinstance(uri, str) and uri.strip() != "", key, uri, f"a tracking URI: {URI_FORMS}")
    scheme = urlparse(uri).scheme.lower()
    check(scheme in _tracking_schemes() or scheme.startswith(_DATABASES), key, uri,
          f"a tracking URI: {URI_FORMS} (MLflow has no tracking store for {scheme}://; a package may add one "
          "in entry-point group mlflow.tracking_store)")  # fmt: skip
    check(not _is_file_store(uri) or _file_store_allowed(), key, uri,
          f"a tracking URI: {URI_FORMS} (MLflow 3 opens a folder or file:// store only with "
          f"{FILE_STORE_ENV}=true)")  # fmt: skip
    # SQLAlchemy's sqlite:// and sqlite:///:memory: are a database in one process's memory: the
    # tracking helper's, gone with it, and every run logged there with it
    check(not uri.startswith("sqlite:") or sqlite_path(uri) is not None, key, uri,
          "an SQLite store in a file, sqlite:///PATH (an in-memory one is lost when the process ends)")  # fmt: skip


def _is_file_store(uri: str) -> bool:
    """A folder or ``file://``: what MLflow opens as its file store (these names aside)."""
    return uri not in ("databricks", "databricks-uc", "uc") and urlparse(uri).scheme in ("", "file")


def _file_store_allowed() -> bool:
    return os.environ.get(FILE_STORE_ENV, "").strip().lower() in ("true", "1")


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
    _set_http_defaults()  # on each call: MLflow reads them as it works (a run's URL is printed as it ends)
    path = sqlite_path(uri)
    if path is not None:
        prepare_sqlite(path)
    return _client(uri, path.stat().st_ino if path is not None else None)


def _set_http_defaults() -> None:
    for key, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


def prepare_sqlite(path: Path) -> None:
    """An SQLite store ready to open: one that exists is opened once, cheaply (MLflow retries a
    file it cannot open with doubling waits, for about 100 s, before it says so); a new one is
    made whole beside it under a lock and moved into place. MLflow migrates a new file in place,
    some forty steps that are not one transaction: two processes doing it at once (two first
    runs, a run and ``sync``, a run and ``make ui``), or one killed midway, left a store that
    no later run or sync could open."""
    if _holds_data(path):
        return open_sqlite(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / f".{path.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
            if not _holds_data(path):  # nobody made it while this process waited
                for stale in path.parent.glob(f".{path.name}.*.tmp*"):  # a creator killed midway (it held the lock)
                    stale.unlink(missing_ok=True)
                _create_sqlite(path)
    except (OSError, sqlite3.Error) as e:
        raise StoreError(f"cannot create the SQLite store {path}: {e}") from e


def _holds_data(path: Path) -> bool:
    """A file with something in it (an empty one is what a store begins as, or a touched file)."""
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def _create_sqlite(path: Path) -> None:
    """MLflow's tables in a file of this process's, then renamed over ``path`` (atomic: readers
    see no store or a whole one; a process killed here leaves only its temporary file)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    uri = f"sqlite:///{temporary}"
    try:
        _quiet_mlflow_logs()
        SqlAlchemyStore(uri, str(artifact_root(f"sqlite:///{path}")))  # creates and migrates the tables
        _forget_engine(uri)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def open_sqlite(path: Path) -> None:
    """Open the SQLite file once, cheaply, or say in one line why it cannot be opened."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except (OSError, sqlite3.Error) as e:
        raise StoreError(f"cannot open the SQLite store {path}: {e}") from e


def check_store_to_read(uri: str) -> None:
    """For a command that only reads (a report): an SQLite ``uri`` must be an MLflow store
    already. Opening it with MLflow would create the file, or add MLflow's tables to another
    program's database."""
    path = sqlite_path(uri)
    if path is None:
        return
    if not path.is_file():
        raise StoreError(f"no MLflow store at {path}: nothing was logged there (a run or sync creates it)")
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as e:
        raise StoreError(f"cannot read the SQLite store {path}: {e}") from e
    if not {"experiments", "runs"} <= tables:
        raise StoreError(f"{path} is an SQLite database but not an MLflow store (it has no experiments table)")


@functools.lru_cache(maxsize=8)
def _client(uri: str, identity: int | None) -> Any:
    return _new_client(uri)


def _new_client(uri: str) -> Any:
    if sqlite_path(uri) is not None:
        _forget_engine(uri)
    from mlflow import MlflowClient

    _quiet_mlflow_logs()
    return MlflowClient(tracking_uri=uri)


def _quiet_mlflow_logs() -> None:
    """A new store's migrations log at INFO, and a failing database write logs its traceback at
    ERROR (92 lines for a full disk) before the exception that says the same in one line."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


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
        location = (root / folder_name(name)).as_uri() if root is not None else None
        try:
            return mlflow_client.create_experiment(name, artifact_location=location,
                                                   tags={EXPERIMENT_KIND_TAG: CLASSIC_KIND})  # fmt: skip
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
    _failure = one_line(error)
    print(f"warning: MLflow tracking failed ({_failure}); tracking is off for this process, "
          f"the results are on disk in {where} (python -m paged_bench.tracking.sync uploads them)", file=sys.stderr)  # fmt: skip


def reset_failure() -> None:
    """For tests: forget an earlier failure."""
    global _failure
    _failure = None
