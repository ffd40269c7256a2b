"""A sweep's view in the MLflow UI: the link a sweep prints opens its jobs as rows with their key
figures and swept settings as columns, in the UI's classic machine-learning mode.

What the UI of MLflow 3.17 honours (read from its shipped bundle, ``mlflow/server/js/build``):

- A *saved view* is an experiment tag ``mlflow.sharedViewState.<id>`` holding
  ``{"name", "createdAt", "updatedAt", "state"}``, ``state`` a JSON text of the runs page's
  search (``searchFilter``, ``orderByKey``, ``orderByAsc``, ...) and its layout
  (``selectedColumns`` as ``metrics.`KEY``` / ``params.`KEY```, ``compareRunCharts``, ...). The
  page opens it from ``#/experiments/<id>/runs?viewStateShareKey=<id>``, and lists it under
  "Views". (The page's own column choice lives in the browser's local storage; with none it
  shows Source, Models and Dataset only, and a sweep is one collapsed row.) The view's search
  names the sweep's jobs (``tags.`mlflow.parentRunId```), so they are rows of their own.
- The mode: the page takes ``workflowType`` from the URL (``machine_learning``), else the
  browser's last choice, GenAI at first; the link carries it. (The experiment tag
  ``mlflow.experimentKind`` = ``custom_model_development``, set too, decides only in builds with
  that switch off: the bundle's flag is on in 3.17.)
- The page nests a run's children under it, collapsed, only when the runs are ordered by start
  time (or neither ordered nor filtered): the view orders them by end time.
- A run's metric logged at several steps is a line chart on its page (Model metrics): the
  parent run logs each key figure of its jobs as ``by_job/<metric>`` at step = job number.
- A run's description is markdown whose images the page loads from their address: the
  sweep's plots, linked by file name in its report, are shown from the server's
  ``get-artifact?path=<file>&run_uuid=<run>`` (where a parent run's artifacts are).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

from paged_bench.tracking.store import CLASSIC_KIND, EXPERIMENT_KIND_TAG, sqlite_path, without_credentials

# the figures a person compares first (docs/metrics.md): TTFT p50/p99, TPOT, throughput, KV peak
# (the report's: reserved slots; a cluster's, all replicas at once), preemptions; an experiment's
# own report.metrics come before them
KEY_METRICS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "output_throughput", "kv_reserved_slots_peak",
               "cluster_kv_reserved_slots_peak", "num_preemptions")  # fmt: skip
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_KEY = "viewStateShareKey"
WORKFLOW = {"workflowType": "machine_learning"}
BY_JOB = "by_job/"
UI_PORT_ENV = "UI_PORT"  # make ui's port (Makefile), where an SQLite store's runs are seen
DEFAULT_UI_PORT = 5000
_PARENT = "mlflow.parentRunId"
_PLOT_LINK = re.compile(r"!\[([^\]]*)\]\(([^()\s/:]+\.png)\)")  # ![title](name.png): the report's plots
# the jobs in the order they ended (the order they ran, for a sweep run one job at a time): not
# their start time, the one order under which the page nests a run's children under it, collapsed
# (its bundle: shouldFetchParents = no order and no filter, or attributes.start_time)
ORDER_BY = "attributes.`end_time`"  # quoted: the page's sort button names it (end_time)


def _job(run: Any) -> int:
    try:
        return int(run.data.tags.get("job_num", ""))
    except ValueError:
        return -1


def sweep_jobs(mlflow_client: Any, experiment_id: str, parent_run_id: str) -> list[Any]:
    """The parent's children, in job order."""
    found = mlflow_client.search_runs([experiment_id], f"tags.`{_PARENT}` = '{parent_run_id}'", max_results=1000)
    return sorted(found, key=lambda r: (_job(r), r.info.start_time))


def key_metrics(jobs: Sequence[Any]) -> list[str]:
    """The experiment's declared report metrics, then ``KEY_METRICS``: those the jobs logged."""
    declared: list[str] = []
    for run in jobs:
        try:
            declared = [str(m) for m in json.loads(run.data.params.get("report.metrics") or "[]")]
        except (ValueError, TypeError):
            declared = []
        break
    logged = {k for run in jobs for k in run.data.metrics}
    return [m for m in dict.fromkeys([*declared, *KEY_METRICS]) if m in logged]


def swept_params(jobs: Sequence[Any], settings: Sequence[str]) -> list[str]:
    """The params the sweep varied: each swept setting by its param name (a config group, such as
    ``scheduler``, by its ``.name``); without settings, every param whose value differs."""

    def varies(key: str) -> bool:
        return len({run.data.params.get(key) for run in jobs}) > 1

    names = []
    for setting in settings:
        key = next((k for k in (setting, f"{setting}.name") if any(k in r.data.params for r in jobs)), None)
        if key is not None and varies(key):
            names.append(key)
    if names or settings:
        return names
    return sorted(k for k in {k for r in jobs for k in r.data.params} if varies(k))


def _column(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"  # the page's column id (its bundle: e + ".`" + t + "`")


def _charts(metrics: Sequence[str], jobs: int) -> dict[str, Any]:
    """The Charts tab: a first section of bar charts, one per key figure, every job a bar (the
    page draws 10 runs by default); the page adds the other metrics' charts after it."""
    section = "paged_bench-key-figures"
    cards = [{"uuid": f"{section}-{m}", "type": "BAR", "runsCountToCompare": max(jobs, 10), "metricSectionId": section,
              "deleted": False, "isGenerated": False, "metricKey": m, "displayName": m} for m in metrics]  # fmt: skip
    sections = [{"uuid": section, "name": "Key figures", "display": True, "isReordered": True, "deleted": False}]
    return {"compareRunCharts": cards, "compareRunSections": sections, "isAccordionReordered": True}


def view_state(parent_run_id: str, metrics: Sequence[str], params: Sequence[str], jobs: int) -> dict[str, Any]:
    """The runs page's state: the jobs as rows, in the order they ended, the swept settings and
    key figures as columns beside the run name, every job shown in the charts."""
    named = {_column("params", p): p for p in params} | {_column("metrics", m): m for m in metrics}
    widths = {column: max(90, int(7.5 * len(name)) + 28) for column, name in named.items()}  # the whole name shows
    return {"searchFilter": f"tags.`{_PARENT}` = '{parent_run_id}'", "orderByKey": ORDER_BY, "orderByAsc": True,
            "selectedColumns": list(named), "columnOrder": list(named), "columnWidths": widths,
            "runListHidden": False, "runsHiddenMode": "SHOW_ALL", **_charts(metrics, jobs)}  # fmt: skip


def publish_sweep_view(mlflow_client: Any, parent_run_id: str, name: str) -> str:
    """Save the sweep's view on its experiment and chart its jobs' key figures on the parent run;
    the view's id (the parent run's). The swept settings are the parent's params (the sweep's
    overrides) whose values differ between its jobs."""
    from mlflow.entities import Metric

    parent = mlflow_client.get_run(parent_run_id)
    experiment_id = parent.info.experiment_id
    jobs = sweep_jobs(mlflow_client, experiment_id, parent_run_id)
    metrics = key_metrics(jobs)
    # each point at its job's end: saved again (sync, a new screenshot), the same points, not new ones
    series = [Metric(BY_JOB + m, run.data.metrics[m], run.info.end_time or run.info.start_time, _job(run))
              for run in jobs if _job(run) >= 0 for m in metrics if m in run.data.metrics]  # fmt: skip
    if series:
        mlflow_client.log_batch(parent_run_id, metrics=series)
    state = view_state(parent_run_id, metrics, swept_params(jobs, list(parent.data.params)), len(jobs))
    now = int(time.time() * 1000)
    envelope = {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    mlflow_client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + parent_run_id, json.dumps(envelope))
    mlflow_client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, CLASSIC_KIND)
    return parent_run_id


def plots_shown(markdown: str, run_id: str) -> str:
    """The sweep's report as the parent run's description: its plots (artifacts of that run, at
    its root) linked where the UI's server serves them, so the description shows them."""
    return _PLOT_LINK.sub(lambda m: f"![{m[1]}](get-artifact?path={quote(m[2])}&run_uuid={run_id})", markdown)


def ui_root(uri: str) -> str | None:
    """Where the UI of the store ``uri`` is: a server's own address, ``make ui``'s for an SQLite
    store (``$UI_PORT``, default 5000); None for others (Databricks)."""
    if sqlite_path(uri) is not None:
        return f"http://127.0.0.1:{os.environ.get(UI_PORT_ENV) or DEFAULT_UI_PORT}"
    if uri.startswith(("http://", "https://")):
        return without_credentials(uri).rstrip("/")
    return None


def view_url(uri: str, experiment_id: str, view_id: str) -> str | None:
    root = ui_root(uri)
    if root is None:
        return None
    return f"{root}/#/experiments/{experiment_id}/runs?{urlencode({**WORKFLOW, VIEW_KEY: view_id})}"
