"""Where a finished job's folder gets logged to MLflow, and by whom.

- A single run: handed to this process's tracking helper (``tracking.uploader``), and waited
  for, so that the command's results are in the store when it returns.
- A sweep's job in the sweep's own process: handed over without waiting; the sweep waits for
  all of them when it ends.
- A sweep's job in another process on the sweep's host (joblib, submitit_local, a local Ray):
  nothing to do, the sweep's process logs every job folder when the sweep ends.
- A sweep's job on another host (SLURM, a Ray cluster): logged by its own process as a child
  of the parent run named in ``sweep.json``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from paged_bench.cli import sweep, sweep_folder


def settings_of(config: dict[str, Any]) -> dict[str, Any]:
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
