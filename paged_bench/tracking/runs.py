"""Logging a finished job, and a sweep's parent run, to MLflow in a few batched calls.

A job is logged when it ends (its summary printed first): one ``create_run`` (started at the
job's start), one ``log_batch`` for params, summary metrics and step-wise series (MLflow splits
it into its per-call limits), the artifacts, and ``set_terminated`` with the job's status, so
no job run is ever left RUNNING. A sweep's parent run is created when the sweep starts (its
jobs, maybe in other processes, attach to it by id) and closed by whoever ends the sweep.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from paged_bench.flat import flatten
from paged_bench.step_records import StepRecords
from paged_bench.tracking import store

# a job's status -> MLflow's
RUN_STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
# engine step column -> the series charted in the UI, one point per step (step = its index)
STEP_SERIES = {
    "batch_size": "step/batch_size",
    "waiting": "step/queue_length",
    "kv_live_slots": "step/kv_live_slots",
    "kv_reserved_slots": "step/kv_reserved_slots",
}
PREEMPTIONS_SERIES = "step/preemptions_total"  # cumulative, so that thinning loses none
PARENT_TAG = "mlflow.parentRunId"
KIND_TAG = "paged_bench.kind"  # run | sweep
_MAX_PARAM = 6000  # MLflow's limit on a param value
_MAX_TAG = 5000


@dataclass(frozen=True)
class Link:
    """A run that other processes attach to: a sweep's parent."""

    uri: str
    experiment_id: str
    run_id: str


@dataclass
class JobRecord:
    """What a finished job hands to tracking."""

    config: Mapping[str, Any]
    run_dir: Path
    status: str  # finished | failed | interrupted
    error: str | None
    start_time: float  # epoch seconds
    run_name: str
    summary: Mapping[str, Any] = field(default_factory=dict)
    steps: StepRecords = field(default_factory=StepRecords)
    artifacts: list[Path] = field(default_factory=list)  # files; a folder goes in as a folder
    tags: dict[str, str] = field(default_factory=dict)
    note: str | None = None  # the run's description in the UI


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


@cache
def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def common_tags(experiment: str | None) -> dict[str, str]:
    """Tags every run carries: experiment, git commit, host."""
    tags = {"experiment": experiment or "", "host": socket.gethostname(), "mlflow.source.name": "paged_bench"}
    commit = _git("rev-parse", "HEAD")
    if commit:
        tags["git_commit"] = tags["mlflow.source.git.commit"] = commit
        tags["git_dirty"] = str(bool(_git("status", "--porcelain", "--untracked-files=no"))).lower()
    return tags


def params_of(config: Mapping[str, Any]) -> dict[str, str]:
    """The resolved config, flattened, as MLflow params (the store settings are not params)."""
    out = {}
    for key, value in flatten(config).items():
        if key.startswith("tracking."):
            continue
        text = "null" if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        out[key] = text[:_MAX_PARAM]
    return out


def summary_metrics(summary: Mapping[str, Any], timestamp: int) -> list:
    from mlflow.entities import Metric

    return [
        Metric(k, float(v), timestamp, 0)
        for k, v in summary.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)
    ]


def step_metrics(steps: StepRecords, start_ms: int, max_points: int) -> list:
    """The step-wise series, thinned to ``max_points`` per series; timestamps follow the run's
    clock, so the UI's relative-time axis shows run time (virtual time for the sim)."""
    from mlflow.entities import Metric

    if not steps or max_points <= 0:
        return []
    stride = math.ceil(len(steps) / max_points)
    out, preempted = [], 0
    for i, row in enumerate(steps.rows()):
        preempted += row.preemptions
        if i % stride and i != len(steps) - 1:
            continue
        step, ts = row.step, start_ms + _ms(row.time)
        out += [Metric(name, float(getattr(row, c)), ts, step) for c, name in STEP_SERIES.items()]
        out.append(Metric(PREEMPTIONS_SERIES, float(preempted), ts, step))
    return out


def _log_artifacts(mlflow_client: Any, run_id: str, paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            mlflow_client.log_artifacts(run_id, str(path), path.name)
        elif path.is_file():
            mlflow_client.log_artifact(run_id, str(path))


def _terminate(mlflow_client: Any, run_id: str, status: str) -> None:
    mlflow_client.set_terminated(run_id, status, _ms(time.time()))


def log_job(rec: JobRecord, settings: Mapping[str, Any], parent: Link | None = None) -> str | None:
    """Log ``rec`` as a run (a child of ``parent`` in a sweep); its id, or None when tracking
    is off or failed (warned once)."""
    if store.failure():
        return None
    run_id, mlflow_client = None, None
    try:
        from mlflow.entities import Param

        uri = parent.uri if parent else store.resolve_uri(settings.get("uri"))
        mlflow_client = store.client(uri)
        name = rec.config.get("experiment_name") or "paged_bench"
        exp = parent.experiment_id if parent else store.experiment_id(mlflow_client, name, uri)
        tags = {**common_tags(name), **rec.tags, KIND_TAG: "run", "status": rec.status, "run_dir": str(rec.run_dir)}
        if rec.error:
            tags["error"] = rec.error[:_MAX_TAG]
        if rec.note:
            tags["mlflow.note.content"] = rec.note[:_MAX_TAG]
        if parent:
            tags[PARENT_TAG] = parent.run_id
        start_ms = _ms(rec.start_time)
        run_id = mlflow_client.create_run(exp, start_time=start_ms, tags=tags, run_name=rec.run_name).info.run_id
        metrics = summary_metrics(rec.summary, _ms(time.time()))
        metrics += step_metrics(rec.steps, start_ms, int(settings.get("step_metrics", 500) or 0))
        params = [Param(k, v) for k, v in params_of(rec.config).items()]
        mlflow_client.log_batch(run_id, metrics=metrics, params=params)
        _log_artifacts(mlflow_client, run_id, rec.artifacts)
        _terminate(mlflow_client, run_id, RUN_STATUS.get(rec.status, "FAILED"))
        return run_id
    except KeyboardInterrupt:
        _close_quietly(mlflow_client, run_id, "KILLED")
        raise
    except Exception as e:  # noqa: BLE001  (tracking must never cost the run its results)
        _close_quietly(mlflow_client, run_id, "FAILED")
        store.report_failure(e, str(rec.run_dir))
        return None


def _close_quietly(mlflow_client: Any, run_id: str | None, status: str) -> None:
    if mlflow_client is not None and run_id is not None:
        try:
            _terminate(mlflow_client, run_id, status)
        except Exception:  # noqa: BLE001, S110  (the store is what failed: nothing more to do)
            pass


def start_sweep(
    settings: Mapping[str, Any], experiment: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, str]
) -> Link | None:
    """Create a sweep's parent run (RUNNING until ``finish_sweep``); None if the store fails."""
    if store.failure():
        return None
    mlflow_client, run_id = None, None
    try:
        from mlflow.entities import Param

        uri = store.resolve_uri(settings.get("uri"))
        mlflow_client = store.client(uri)
        exp = store.experiment_id(mlflow_client, experiment, uri)
        tags = {**common_tags(experiment), **tags, KIND_TAG: "sweep"}
        run_id = mlflow_client.create_run(exp, tags=tags, run_name=run_name).info.run_id
        if params:
            mlflow_client.log_batch(run_id, params=[Param(k, v[:_MAX_PARAM]) for k, v in params.items()])
        return Link(uri, exp, run_id)
    except Exception as e:  # noqa: BLE001  (a sweep runs without tracking rather than not at all)
        _close_quietly(mlflow_client, run_id, "FAILED")
        store.report_failure(e, str(tags.get("sweep_dir", "runs/")))
        return None


def finish_sweep(link: Link, status: str, artifacts: list[Path], tags: Mapping[str, str]) -> None:
    """Attach the sweep's summary (tables, plots) to its parent run and close it; best effort,
    but the run is closed even when the artifacts cannot be logged."""
    try:
        mlflow_client = store.client(link.uri)
    except Exception as e:  # noqa: BLE001  (warned once; nothing to close without a client)
        store.report_failure(e, str(tags.get("sweep_dir", "runs/")))
        return
    try:
        from mlflow.entities import RunTag

        mlflow_client.log_batch(link.run_id, tags=[RunTag(k, v[:_MAX_TAG]) for k, v in tags.items()])
        _log_artifacts(mlflow_client, link.run_id, artifacts)
    except Exception as e:  # noqa: BLE001  (the run is closed below all the same)
        store.report_failure(e, str(tags.get("sweep_dir", "runs/")))
    finally:
        _close_quietly(mlflow_client, link.run_id, status)
