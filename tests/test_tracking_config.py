"""Tracking's settings are checked before anything runs: a bad ``tracking.*``, ``experiment_name``
or store URI (a folder or ``file://``, which MLflow 3 refuses) is one line and exit 2, for a run
and for a sweep before its first job; a store that cannot be opened fails in seconds; a store's
long error is shortened without losing why it failed."""

from __future__ import annotations

import time

import pytest

from paged_bench.errors import ERROR_CHARS, ConfigError, one_line
from paged_bench.run.tracking_settings import TrackingSettings
from paged_bench.tracking import store
from tests.conftest import compose_config
from tests.tracking_support import call_cli

BAD_SETTINGS = [
    ("tracking.enabled=no", "tracking.enabled='no' is not allowed: true or false"),
    ("tracking.enabled=maybe", "tracking.enabled='maybe' is not allowed: true or false"),
    ("tracking.step_metrics=abc", "tracking.step_metrics='abc' is not allowed: an integer >= 0"),
    ("tracking.step_metrics=-1", "tracking.step_metrics=-1 is not allowed: an integer >= 0"),
    ("tracking.step_metrics=1.5", "tracking.step_metrics=1.5 is not allowed: an integer >= 0"),
    ("tracking.plots=foo", "tracking.plots='foo' is not allowed: auto, true or false"),
    ("tracking.plots=1", "tracking.plots=1 is not allowed: auto, true or false"),  # 1 == True meant no plots
    ("tracking.uri=sqlite:///:memory:", "tracking.uri='sqlite:///:memory:' is not allowed: an SQLite store in a file"),
    ("tracking.uri=sqlite://", "tracking.uri='sqlite://' is not allowed: an SQLite store in a file"),
    ("tracking.uri=123", "tracking.uri=123 is not allowed: a tracking URI: sqlite:///PATH"),
    # ran, then "MLflow tracking failed (UnsupportedModelRegistryStoreURIException: ... 'ftp://x')"
    ("tracking.uri=ftp://x", "tracking.uri='ftp://x' is not allowed: a tracking URI: sqlite:///PATH"),
    ("+tracking.url=x", "tracking.url='x' is not allowed: one of enabled, uri, step_metrics, plots"),
    ("experiment_name=123", "experiment_name=123 is not allowed: a name of 1 to 500 characters (the MLflow "
                            "experiment), or null (a number is a name in quotes: \"experiment_name='123'\")"),
    ("experiment_name=' '", "experiment_name=' ' is not allowed: a name of 1 to 500 characters"),
]
FILE_STORES = ["/tmp/fstore", "file:///tmp/fstore", "relative/folder"]


@pytest.mark.parametrize(("override", "message"), BAD_SETTINGS)
def test_bad_tracking_settings_name_the_key_and_what_is_allowed(override, message, monkeypatch):
    monkeypatch.delenv(store.URI_ENV, raising=False)
    with pytest.raises(ConfigError) as e:
        TrackingSettings.from_config(compose_config(override))
    assert str(e.value).startswith(message)


def test_good_tracking_settings_pass(monkeypatch):
    monkeypatch.delenv(store.URI_ENV, raising=False)
    good = [(), ("tracking.enabled=false",), ("tracking.step_metrics=0", "tracking.plots=true"),
            ("experiment_name=null",), ("tracking.uri=sqlite:///rel/x.db",), ("tracking.uri=databricks",),
            ("tracking.uri=http://127.0.0.1:5000",), ("tracking.enabled=false", "tracking.uri=/a/folder"),
            ("tracking.uri=postgresql+psycopg2://u@h/db",), ("tracking.uri=HTTPS://h",)]  # fmt: skip
    for overrides in good:
        TrackingSettings.from_config(compose_config(*overrides))


@pytest.mark.parametrize("uri", FILE_STORES)
def test_a_file_store_is_refused_unless_mlflow_is_told_to_open_it(uri, monkeypatch):
    monkeypatch.delenv(store.FILE_STORE_ENV, raising=False)
    with pytest.raises(ConfigError, match="sqlite:///PATH, http.*MLFLOW_ALLOW_FILE_STORE=true"):
        store.check_uri(uri, "tracking.uri")
    monkeypatch.setenv(store.URI_ENV, uri)  # the environment's store is checked too, by its name
    with pytest.raises(ConfigError, match=f"^{store.URI_ENV}="):
        store.check_uri(None, "tracking.uri")
    monkeypatch.setenv(store.FILE_STORE_ENV, "true")
    store.check_uri(uri, "tracking.uri")
    assert store.resolve_uri(uri).startswith("file:///")  # absolute: the tracking helper runs elsewhere


def test_each_jobs_own_tracking_settings_are_checked_before_the_sweep():
    config = compose_config()
    TrackingSettings.for_jobs(config, [["max_batch=4"], ["max_batch=8", "tracking.step_metrics=5"]])
    with pytest.raises(ConfigError, match="tracking.step_metrics='abc'"):
        TrackingSettings.for_jobs(config, [["tracking.step_metrics=5"], ["tracking.step_metrics=abc"]])
    with pytest.raises(ConfigError, match="experiment_name=7"):
        TrackingSettings.for_jobs(config, [["experiment_name=7"]])


def test_a_run_with_a_bad_setting_stops_before_it_runs(tmp_path):
    for override, message in [BAD_SETTINGS[0], ("tracking.uri=/tmp/fstore", "tracking.uri='/tmp/fstore'")]:
        proc = call_cli(tmp_path, override)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"error: {message}") and proc.stderr.count("\n") == 1, proc.stderr
        assert not list(tmp_path.glob("runs/20*/*/summary.json")) and not (tmp_path / "runs" / "mlflow.db").exists()


def test_a_sweep_with_a_bad_setting_stops_before_its_first_job(tmp_path):
    proc = call_cli(tmp_path, "-m", "tracking.uri=123", "max_batch=4,8", "workload.num_requests=5")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: tracking.uri=123 is not allowed") and proc.stderr.count("\n") == 1
    assert not list(tmp_path.glob("runs/multirun/*/*/0")), "a job ran"
    proc = call_cli(tmp_path, "-m", "tracking.step_metrics=5,abc", "workload.num_requests=5")  # a job's own
    assert proc.returncode == 2 and proc.stderr.startswith("error: tracking.step_metrics='abc'"), proc.stderr
    assert not list(tmp_path.glob("runs/multirun/*/*/0")), "a job ran"


def test_an_sqlite_store_that_cannot_be_opened_fails_at_once(tmp_path):
    (tmp_path / "folder.db").mkdir()
    started = time.monotonic()
    with pytest.raises(store.StoreError, match=r"cannot open the SQLite store .*folder.db: unable to open"):
        store.client(f"sqlite:///{tmp_path / 'folder.db'}")
    assert time.monotonic() - started < 5  # MLflow alone retries it for ~100 s


def test_a_long_error_keeps_what_failed_and_why():
    mlflow_says = ("The filesystem tracking backend (e.g., './mlruns') is in maintenance mode and will not receive "
                   "further updates. Please migrate to a database backend (e.g., 'sqlite:///mlflow.db') to access the "
                   "latest MLflow features. The `mlflow migrate-filestore` tool migrates your existing data "
                   "losslessly. If the filesystem backend is required for your workflow, set "
                   "`MLFLOW_ALLOW_FILE_STORE=true` to opt out of this exception.")  # fmt: skip
    line = one_line(RuntimeError(mlflow_says + "\nsecond line"))
    assert len(line) <= ERROR_CHARS
    assert line.startswith("RuntimeError: The filesystem tracking backend (e.g., './mlruns') is in maintenance mode")
    assert line.endswith("set `MLFLOW_ALLOW_FILE_STORE=true` to opt out of this exception.")
    words = set(mlflow_says.split())
    assert all(w in words for w in line.removeprefix("RuntimeError: ").split() if w != "...")  # none cut mid-word
    refused = f"Max retries exceeded (Caused by NewConnectionError({'x' * 300} [Errno 111] Connection refused'))"
    assert store.one_line(OSError(refused)).endswith("[Errno 111] Connection refused'))")
    assert store.one_line(ValueError("short")) == "ValueError: short"


def test_a_store_is_known_by_where_it_is_not_how_its_uri_is_spelt(tmp_path, monkeypatch):
    """What sync compares a run's recorded store with the one it is told to upload to: spelt
    another way, the store a run was meant for is still that store (and another is not)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(store.URI_ENV, raising=False)
    assert store.same_store("http://Team.Example:5000/", "http://user:pw@team.example:5000")
    assert not store.same_store("http://team.example:5000", "http://team.example:5001")
    assert store.same_store("sqlite:///runs/mlflow.db", store.default_uri())  # relative: from where sync runs
    assert not store.same_store(store.default_uri(), f"sqlite:///{tmp_path / 'other.db'}")
    # a password that came from $MLFLOW_TRACKING_URI is not written into the run's folder (uploaded with it)
    monkeypatch.setenv(store.URI_ENV, "https://me:secret@team.example/mlflow")
    assert store.recorded_uri(None) == "https://team.example/mlflow"
    assert store.recorded_uri(123) == "https://team.example/mlflow"  # an untracked run's unchecked tracking.uri
    assert store.recorded_uri("sqlite:///x.db") == f"sqlite:///{tmp_path / 'x.db'}"
