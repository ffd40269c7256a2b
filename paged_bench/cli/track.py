"""Where a finished job's folder gets logged to MLflow, and by whom.

- A single run: handed to this process's tracking helper (``tracking.uploader``), and waited
  for, so that the command's results are in the store when it returns.
- A sweep's job in the sweep's own process: handed over without waiting; the sweep waits for
  all of them when it ends.
- A sweep's job in another process on the sweep's host (joblib, submitit_local, a local Ray):
  nothing to do, the sweep's process logs every job folder when the sweep ends.
- A sweep's job on another host (SLURM, a Ray cluster): logged by its own process as a child
  of the parent run named in ``sweep.json``.

``check_tracking`` refuses bad ``tracking.*`` settings and ``experiment_name`` before a run,
``check_sweep`` before a sweep's first job: found after the run, they would cost its tracking.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paged_bench.cli import sweep, sweep_folder
from paged_bench.errors import check, check_int

SETTINGS = ("enabled", "uri", "step_metrics", "plots")  # conf/config.yaml's tracking section
MAX_EXPERIMENT_NAME = 500  # MLflow's limit


def check_tracking(config: Mapping[str, Any]) -> None:
    """Raise ConfigError for the first bad tracking setting of a resolved config."""
    name = config.get("experiment_name")
    ok = name is None or (isinstance(name, str) and name.strip() != "" and len(name) <= MAX_EXPERIMENT_NAME)
    quote = f" (a number is a name in quotes: \"experiment_name='{name}'\")" if isinstance(name, (int, float)) else ""
    check(ok, "experiment_name", name, f"a name of 1 to {MAX_EXPERIMENT_NAME} characters (the MLflow experiment), "
                                       f"or null{quote}")  # fmt: skip
    settings = config.get("tracking") or {}
    check(isinstance(settings, Mapping), "tracking", settings, f"a mapping with keys {', '.join(SETTINGS)}")
    for key, value in settings.items():
        check(key in SETTINGS, f"tracking.{key}", value, f"one of {', '.join(SETTINGS)}")
    enabled = settings.get("enabled", True)
    check(isinstance(enabled, bool), "tracking.enabled", enabled, "true or false")
    check_int("tracking.step_metrics", settings.get("step_metrics", 100), 0)
    plots = settings.get("plots", "auto")
    # isinstance, not ``in (True, False)``: 1 == True, and 1 then meant no plots
    check(isinstance(plots, bool) or plots == "auto", "tracking.plots", plots, "auto, true or false")
    if enabled:  # the store is looked at only when something will be logged to it
        from paged_bench.tracking import store

        store.check_uri(settings.get("uri"), "tracking.uri")


def check_sweep(config: Mapping[str, Any], jobs: list[list[str]]) -> None:
    """``check_tracking`` of the sweep's config and of each job's (``jobs``: their overrides,
    as the sweeper expands them), before the first job runs."""
    base = {"experiment_name": config.get("experiment_name"), "tracking": dict(config.get("tracking") or {})}
    check_tracking(base)
    for overrides in jobs:
        check_tracking(_overridden(base, overrides))


def _overridden(base: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``base`` with a job's own ``experiment_name`` and ``tracking.*`` overrides, typed as
    Hydra types them (``tracking.uri=123`` is an integer)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = {"experiment_name": base["experiment_name"], "tracking": dict(base["tracking"])}
    for override in OverridesParser.create().parse_overrides(overrides):
        key, value = override.key_or_group, override.value()
        if override.is_delete() or (isinstance(value, str) and "${" in value):
            continue  # the default; or an interpolation, which only the job can resolve (and check)
        if key == "experiment_name":
            out[key] = value
        elif key.startswith("tracking."):
            out["tracking"][key.removeprefix("tracking.")] = value
    return out


def settings_of(config: Mapping[str, Any]) -> dict[str, Any]:
    return dict(config.get("tracking") or {})


def wants_plots(settings: dict[str, Any], in_sweep: bool) -> bool:
    """A run's own PNGs: single runs by default (a sweep's parent gets the comparison plots)."""
    plots = settings.get("plots", "auto")
    return plots is True or (plots == "auto" and not in_sweep)


def track_job(config: dict[str, Any], run_dir: Path, sweep_dir: Path | None) -> None:
    settings = settings_of(config)
    from paged_bench.tracking import store

    if not settings.get("enabled", True) or store.failure():
        return
    request: dict[str, Any] = {"run_dir": str(run_dir.resolve()), "settings": settings,
                               "plots": wants_plots(settings, sweep_dir is not None)}  # fmt: skip
    info = sweep_folder.sweep_info(sweep_dir) if sweep_dir is not None else {}
    if info:
        if not info.get("tracking"):
            return  # tracking off for the sweep, or its store failed when it started (warned)
        if info.get("pid") == os.getpid():
            sweep.submit_job(run_dir)
            return
        if info.get("host") == socket.gethostname():
            return  # the sweep's process logs it when the sweep ends
        request["parent"] = info["tracking"]
    request["uri"] = store.resolve_uri(settings.get("uri"))
    request["experiment"] = config.get("experiment_name") or "paged_bench"
    from paged_bench.tracking import uploader

    try:
        uploader.shared().request("run", **request)
    except uploader.UploadError as e:
        store.report_failure(e, str(run_dir))
