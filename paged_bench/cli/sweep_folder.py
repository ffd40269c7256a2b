"""A sweep's folder on disk, the state its processes share: ``sweep.json`` (written by the
sweep's process as it starts, read by every job, wherever the launcher runs it) and what each
job folder recorded in its ``run_info.json`` (who runs it, how it ended). The sweep's process
reads it to count jobs, to signal the running ones, and to record those cut off (``sweep``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from paged_bench.files import write_whole
from paged_bench.report.load import RUN_INFO, read_json, update_run_info

SWEEP_FILE = "sweep.json"
STATUS_FILE = RUN_INFO  # every job writes it, with its status, when it ends


def sweep_info(sweep_dir: Path) -> dict[str, Any]:
    """What ``start`` wrote in the sweep folder (empty if it did not)."""
    try:
        return json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return {}


def write_info(sweep_dir: Path, info: dict[str, Any]) -> None:
    """Write ``sweep.json`` whole (jobs in other processes read it as they start)."""
    write_whole(sweep_dir / SWEEP_FILE, json.dumps(info, indent=2) + "\n")


def stopping(sweep_dir: Path) -> bool:
    """Whether the sweep was asked to stop: its jobs not started yet must not start."""
    return "stopping" in sweep_info(sweep_dir)


def job_name(overrides: list[str], sweep_dir: Path | None) -> str:
    """A job's MLflow run name: its own overrides (not Hydra's, not those the sweep shares)."""
    shared = set(sweep_info(sweep_dir).get("shared_keys", [])) if sweep_dir else set()
    own = [o for o in overrides if not o.startswith("hydra") and o.split("=", 1)[0] not in shared]
    return " ".join(own) or "default"


def job_info(run_dir: Path) -> dict[str, Any]:
    """What a job recorded in its folder (who runs it, how it ended); empty before it did."""
    return read_json(run_dir / STATUS_FILE)


def job_counts(sweep_dir: Path) -> tuple[int, int]:
    """(jobs ended, jobs that did not finish) from the job folders' status files."""
    done = failed = 0
    for path in sweep_dir.glob(f"*/{STATUS_FILE}"):
        done += 1
        try:
            failed += json.loads(path.read_text()).get("status") != "finished"
        except (OSError, ValueError):
            failed += 1
    return done, failed


def started_jobs(sweep_dir: Path) -> list[Path]:
    """Job folders (Hydra makes one as it starts a job) that have not recorded their end."""
    from paged_bench.report.load import is_run_dir

    jobs = [d for d in sweep_dir.iterdir() if d.name.isdigit() and is_run_dir(d)]
    return [d for d in jobs if "status" not in job_info(d)]


def job_pids(run_dirs: list[Path]) -> list[int]:
    """The processes on this host, other than this one, that run these jobs (each job
    records its own: ``job.run``)."""
    host, me = socket.gethostname(), os.getpid()
    infos = [job_info(d) for d in run_dirs]
    return [i["pid"] for i in infos if i.get("host") == host and isinstance(i.get("pid"), int) and i["pid"] != me]


def record_unfinished(sweep_dir: Path, how: str) -> None:
    """A job that started (Hydra made its folder) but never recorded how it ended was cut off
    with its process: it is recorded as interrupted, so it is logged and counted; in a stopped
    sweep, one that never began (only Hydra's files) is withdrawn, and counted as not run."""
    for run_dir in started_jobs(sweep_dir):
        fields = {"status": "interrupted", "error": f"the sweep {how} before the job did", "end_time": time.time()}
        if "run_name" not in job_info(run_dir):  # cut off before it knew its name
            if how == "was stopped" and _withdraw(run_dir):
                continue
            fields.update(run_name=job_name(_hydra_overrides(run_dir), sweep_dir), job_num=int(run_dir.name))
        update_run_info(run_dir, fields)


def _withdraw(run_dir: Path) -> bool:
    """Remove the folder Hydra made for a job that never began (a launcher handed it out as
    the sweep stopped: only Hydra's files, its log empty), so that it counts as not run."""
    logs = list(run_dir.glob("*.log"))
    if {p.name for p in run_dir.iterdir()} - {".hydra", *(p.name for p in logs)} or any(p.stat().st_size for p in logs):
        return False
    for path in logs:
        path.unlink()
    shutil.rmtree(run_dir / ".hydra", ignore_errors=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()
    return not run_dir.exists()


def _hydra_overrides(run_dir: Path) -> list[str]:
    import yaml

    try:
        return list(yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) or [])
    except (OSError, ValueError, yaml.YAMLError):
        return []
