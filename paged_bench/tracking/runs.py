"""A finished run's folder -> one MLflow run, in a few batched calls.

Tracking reads everything from the folder the job wrote (``config.yaml``, ``run_info.json``,
``summary.json``, ``steps.csv``, the artifacts), never from the job's memory, so a run is
logged the same way whether its own command logs it right after it ends, the sweep's process
logs it, or ``python -m paged_bench.tracking.sync`` uploads it later. ``upload_run`` makes one
``create_run`` (started at the job's start), one ``log_batch`` for params, summary metrics and
step-wise series, the artifacts, the tag that says the upload is complete, and
``set_terminated`` with the job's status: a run is never left RUNNING by a job, and a run
without the completion tag is a broken upload that ``sync`` replaces.
"""

from __future__ import annotations

import csv
import json
import math
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from paged_bench.errors import one_line
from paged_bench.report.load import RUN_INFO, RunFileError, read_json, read_yaml, run_outcome
from paged_bench.results.run_files import format_summary
from paged_bench.results.step_series import cluster_wide
from paged_bench.run.flat import flatten
from paged_bench.tracking.ui import plots_shown, publish_sweep_view

# a job's status -> MLflow's
RUN_STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
# steps.csv column -> the series charted in the UI, one point per step (step = its index)
STEP_SERIES = {
    "batch_size": "step/batch_size",
    "waiting": "step/queue_length",
    "kv_live_slots": "step/kv_live_slots",
    "kv_reserved_slots": "step/kv_reserved_slots",
}
PREEMPTIONS_SERIES = "step/preemptions_total"  # cumulative, so that thinning loses none
PARENT_TAG = "mlflow.parentRunId"
KIND_TAG = "paged_bench.kind"  # run | sweep
UPLOADED_TAG = "paged_bench.uploaded"  # set last: the run holds everything its folder had
COMPLETE = f"tags.`{UPLOADED_TAG}` = 'true'"  # a complete upload, as a search (is_complete: as a test)
NOTE_TAG = "mlflow.note.content"  # the run's description in the UI
REPORT_FILE = "report.md"  # a sweep's report: its parent run's description
RUN_DIR_TAG = "run_dir"  # a run's identity in the store (sync finds what is missing by it)
SWEEP_DIR_TAG = "sweep_dir"
RUN_FILES = ("summary.json", "requests.csv", "steps.csv", RUN_INFO, "config.yaml")
SIGNIFICANT_DIGITS = 6  # metric values as the UI shows them: 356.123, not 356.12345678901
_MAX_PARAM = 6000  # MLflow's limit on a param value
_MAX_TAG = 5000
# the linear sim cost model reads only these backend options; the roofline's are not its params
_LINEAR_SIM_KEYS = {"name", "cost_model", "preset", "step_overhead_ms", "per_prefill_token_ms", "per_decode_seq_ms",
                    "per_kv_token_us", "per_swap_block_ms", "vocab_size"}  # fmt: skip
_MEASURED_ONLY = ("engine_cpu", "all_reduce", "decode_attention")  # and these only the measured cost model


@dataclass(frozen=True)
class Link:
    """A run that other runs attach to: a sweep's parent."""

    uri: str
    experiment_id: str
    run_id: str


def ms(seconds: float) -> int:
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


def _ignored_by_backend(config: Mapping[str, Any]) -> set[str]:
    """Backend options the chosen backend does not read (the roofline's, under the linear sim;
    the measured model's engine CPU and all-reduce, under the roofline)."""
    backend = config.get("backend") or {}
    if backend.get("name") != "sim":
        return set()
    if backend.get("cost_model", "linear") != "linear" or backend.get("preset"):
        # the engine's CPU figure and the all-reduce choice are the measured cost model's alone
        measured = backend.get("cost_model") == "measured" and not backend.get("preset")
        return set() if measured else {f"backend.{k}" for k in _MEASURED_ONLY if k in backend}
    return {f"backend.{k}" for k in backend if k not in _LINEAR_SIM_KEYS}


def params_of(config: Mapping[str, Any]) -> dict[str, str]:
    """The resolved config, flattened, as MLflow params (the store settings, and options the
    run's backend ignores, are not params)."""
    ignored = _ignored_by_backend(config)
    out = {}
    for key, value in flatten(config).items():
        if key.startswith("tracking.") or key in ignored or any(key.startswith(k + ".") for k in ignored):
            continue
        text = "null" if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        out[key] = text[:_MAX_PARAM]
    return out


def rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def summary_metrics(summary: Mapping[str, Any], timestamp: int) -> list:
    from mlflow.entities import Metric

    return [
        Metric(k, rounded(v), timestamp, 0)
        for k, v in summary.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)
    ]


def step_metrics(steps: list[Mapping[str, Any]], start_ms: int, max_points: int) -> list:
    """The step-wise series from ``steps.csv`` rows (read by column name), thinned to
    ``max_points`` per series; timestamps follow the run's clock (a step's end), so the UI's
    relative-time axis shows run time (virtual time for the sim). A cluster's are its replicas'
    summed (``cluster_wide``): each replica's own step numbers made one series jump between them."""
    from mlflow.entities import Metric

    if not steps or max_points <= 0:
        return []
    steps = cluster_wide(steps)
    stride = math.ceil(len(steps) / max_points)
    kept = list(range(0, len(steps), stride))
    kept[-1] = len(steps) - 1  # the last step is always a point (the run's end): still at most max_points
    kept_set = set(kept)
    out, preempted = [], 0
    for i, row in enumerate(steps):
        preempted += int(float(row.get("preemptions") or 0))
        if i not in kept_set:
            continue
        step, ts = int(float(row["step"])), start_ms + ms(float(row["time"]))
        out += [Metric(name, rounded(float(row[c])), ts, step) for c, name in STEP_SERIES.items() if row.get(c) != ""]
        out.append(Metric(PREEMPTIONS_SERIES, float(preempted), ts, step))
    return out


def _step_metrics_of(path: Path, start_ms: int, max_points: int) -> list:
    """``step_metrics`` of a run's ``steps.csv`` (none when it wrote none), or a one-line error
    naming the file when it is not the table a run writes."""
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        return step_metrics(rows, start_ms, max_points)
    except KeyError as e:
        raise RunFileError(path, f"has no column {e}") from e
    except (TypeError, ValueError) as e:  # a cell that is no number, or a short row
        raise RunFileError(path, f"a cell that is no number ({e})") from e


def _note(summary: Mapping[str, Any]) -> str | None:
    if not summary:
        return None
    return "```\n" + format_summary(summary) + "\n```"


def _artifacts(run_dir: Path) -> list[Path]:
    files = [run_dir / name for name in RUN_FILES if (run_dir / name).is_file()]
    return files + ([run_dir / "plots"] if (run_dir / "plots").is_dir() else [])


def log_artifacts(mlflow_client: Any, run_id: str, paths: Iterable[Path]) -> None:
    for path in paths:
        if path.is_dir():
            mlflow_client.log_artifacts(run_id, str(path), path.name)
        elif path.is_file():
            mlflow_client.log_artifact(run_id, str(path))


def terminate(mlflow_client: Any, run_id: str, status: str, end_time: float | None = None) -> None:
    import time

    mlflow_client.set_terminated(run_id, status, ms(end_time or time.time()))


def close_quietly(mlflow_client: Any, run_id: str | None, status: str) -> None:
    if mlflow_client is not None and run_id is not None:
        try:
            terminate(mlflow_client, run_id, status)
        except Exception:  # noqa: BLE001, S110  (the store is what failed: nothing more to do)
            pass


def upload_run(mlflow_client: Any, experiment_id: str, run_dir: Path, settings: Mapping[str, Any],
               parent_run_id: str | None = None) -> str:  # fmt: skip
    """Log the run in ``run_dir`` (a child of ``parent_run_id`` when given); its run id.
    A failure part-way closes what was created as FAILED and raises."""
    from mlflow.entities import Param, RunTag

    run_dir = Path(run_dir).resolve()
    config = read_yaml(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else {}
    info = read_json(run_dir / RUN_INFO)
    summary = read_json(run_dir / "summary.json")
    status, error = run_outcome(info, summary)
    name = (config or {}).get("experiment_name") or "paged_bench"
    tags = {**common_tags(name), KIND_TAG: "run", "status": status, RUN_DIR_TAG: str(run_dir)}
    if info.get("job_num") is not None:
        tags["job_num"] = str(info["job_num"])
    # which code ran each plugin: a run with a plugin package is redone with the same release
    tags.update({f"package.{kind}": dist for kind, dist in (info.get("plugin_packages") or {}).items() if dist})
    if error:
        tags["error"] = str(error)[:_MAX_TAG]
    note = _note(summary)
    if note:
        tags[NOTE_TAG] = note[:_MAX_TAG]
    if parent_run_id:
        tags[PARENT_TAG] = parent_run_id
    start_time = _start_time(run_dir, info)
    run_name = info.get("run_name") or run_dir.name
    end_ms = ms(float(info.get("end_time") or start_time))
    metrics = summary_metrics(summary, end_ms)  # read whole before the run is created: a bad file logs nothing
    metrics += _step_metrics_of(run_dir / "steps.csv", ms(start_time), int(settings.get("step_metrics", 100) or 0))
    run_id = mlflow_client.create_run(experiment_id, start_time=ms(start_time), tags=tags, run_name=run_name).info.run_id
    try:
        params = [Param(k, v) for k, v in params_of(config or {}).items()]
        mlflow_client.log_batch(run_id, metrics=metrics, params=params)
        log_artifacts(mlflow_client, run_id, _artifacts(run_dir))
        mlflow_client.log_batch(run_id, tags=[RunTag(UPLOADED_TAG, "true")])
        terminate(mlflow_client, run_id, RUN_STATUS.get(status, "FAILED"), info.get("end_time"))
    except BaseException:
        close_quietly(mlflow_client, run_id, "FAILED")
        raise
    return run_id


def _start_time(run_dir: Path, info: Mapping[str, Any]) -> float:
    return float(info.get("start_time") or run_dir.stat().st_mtime)


def is_complete(run: Any) -> bool:
    """Whether an MLflow run is a complete upload of its folder (``COMPLETE`` as a search)."""
    return run.data.tags.get(UPLOADED_TAG) == "true"


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def uploads_of(mlflow_client: Any, experiment_id: str, run_dir: Path) -> list[Any]:
    """Every upload, whole or broken, tagged with ``run_dir``."""
    return list(mlflow_client.search_runs([experiment_id], f"tags.`{RUN_DIR_TAG}` = '{_quoted(str(run_dir))}'"))


def complete_upload(mlflow_client: Any, experiment_id: str, run_dir: Path) -> Any | None:
    """The complete upload of the run now in ``run_dir``, if the store has one: an earlier run in
    the same folder (rerun since, with another start time) is another run."""
    run_dir = Path(run_dir).resolve()
    start = ms(_start_time(run_dir, read_json(run_dir / RUN_INFO)))
    found = (r for r in uploads_of(mlflow_client, experiment_id, run_dir) if is_complete(r))
    return next((r for r in found if r.info.start_time == start), None)


def uploaded(mlflow_client: Any, experiment_id: str, tag: str = RUN_DIR_TAG) -> dict[str, Any]:
    """The runs of an experiment by their ``tag`` (run_dir or sweep_dir): value -> run; for
    run folders, only complete uploads count."""
    complete = COMPLETE if tag == RUN_DIR_TAG else f"tags.`{KIND_TAG}` = 'sweep'"
    found: dict[str, Any] = {}
    token = None
    while True:
        page = mlflow_client.search_runs([experiment_id], complete, max_results=1000, page_token=token)
        found.update({r.data.tags[tag]: r for r in page if tag in r.data.tags})
        token = page.token
        if not token:
            return found


def start_sweep(mlflow_client: Any, experiment_id: str, run_name: str, tags: Mapping[str, str],
                params: Mapping[str, str], experiment: str) -> str:  # fmt: skip
    """Create a sweep's parent run (RUNNING until ``finish_sweep``); its id."""
    from mlflow.entities import Param

    tags = {**common_tags(experiment), **tags, KIND_TAG: "sweep"}
    run_id = mlflow_client.create_run(experiment_id, tags=tags, run_name=run_name).info.run_id
    if params:
        mlflow_client.log_batch(run_id, params=[Param(k, str(v)[:_MAX_PARAM]) for k, v in params.items()])
    return run_id


def finish_sweep(mlflow_client: Any, run_id: str, status: str, artifacts: list[Path], tags: Mapping[str, str],
                 view_name: str | None = None) -> str | None:  # fmt: skip
    """Attach the sweep's summary (tables, plots; its ``report.md`` as the description, showing
    the plots) to its parent run, save its view in the UI (``tracking.ui``: its jobs' key
    figures as columns) and close it, whether the sweep's process or ``sync`` closes it; the run is closed even when
    the artifacts cannot be logged (and the failure raised after). The view's id, None without one."""
    from mlflow.entities import RunTag

    tags = {**_description(artifacts, run_id), **tags}
    try:
        mlflow_client.log_batch(run_id, tags=[RunTag(k, str(v)[:_MAX_TAG]) for k, v in tags.items()])
        log_artifacts(mlflow_client, run_id, artifacts)
        return _sweep_view(mlflow_client, run_id, view_name or mlflow_client.get_run(run_id).info.run_name)
    finally:
        terminate(mlflow_client, run_id, status)


def _sweep_view(mlflow_client: Any, run_id: str, name: str) -> str | None:
    try:
        return publish_sweep_view(mlflow_client, run_id, name)
    except Exception as e:  # noqa: BLE001  (the runs and their summary are logged: a view is not worth them)
        print(f"warning: the sweep's view in the MLflow UI could not be saved: {one_line(e)}", file=sys.stderr)
        return None


def _description(artifacts: Iterable[Path], run_id: str) -> dict[str, str]:
    report = next((p for p in artifacts if p.name == REPORT_FILE and p.is_file()), None)
    return {NOTE_TAG: plots_shown(report.read_text(), run_id)} if report is not None else {}
