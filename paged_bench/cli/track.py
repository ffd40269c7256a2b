"""Where a finished job's folder gets logged to MLflow, and by whom.

- A single run: handed to this process's tracking helper (``tracking.uploader``), and waited
  for, so that the command's results are in the store when it returns.
- A sweep's job in the sweep's own process: handed over without waiting; the sweep waits for
  all of them when it ends.
- A sweep's job in another process on the sweep's host (joblib, submitit_local, a local Ray):
  nothing to do, the sweep's process logs every job folder when the sweep ends.
- A sweep's job on another host (SLURM, a Ray cluster): logged by its own process as a child
  of the parent run named in ``sweep.json``.

The settings are read and checked before the job runs (``run.tracking_settings``).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from paged_bench.cli import sweep, sweep_folder
from paged_bench.run.tracking_settings import TrackingSettings
from paged_bench.tracking import store, uploader


def track_job(tracking: TrackingSettings, run_dir: Path, sweep_dir: Path | None) -> None:
    """Log the finished job in ``run_dir`` as its ``tracking`` settings say (``sweep_dir``: the
    sweep it is a job of), by whichever process logs it (see above)."""
    if not tracking.enabled or store.failure():
        return
    settings = tracking.section()
    request: dict[str, Any] = {"run_dir": str(run_dir.resolve()), "settings": settings,
                               "plots": tracking.wants_plots(sweep_dir is not None)}  # fmt: skip
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
    request["uri"] = store.resolve_uri(tracking.uri)
    request["experiment"] = tracking.experiment
    try:
        uploader.shared().request("run", **request)
    except uploader.UploadError as e:
        store.report_failure(e, str(run_dir))
