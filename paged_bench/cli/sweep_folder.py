"""A sweep's folder on disk, the state its processes share: ``sweep.json`` (written by the
sweep's process as it starts, read by every job, wherever the launcher runs it) and what each
job folder recorded in its ``run_info.json`` (who runs it, how it ended). The sweep's process
reads it to count jobs, to signal the running ones, and to record those cut off (``sweep``).

Who holds a folder is the process its record names (``pid``, ``host``): ``alive_here`` is the
one test of it, for a sweep started into a folder another one still uses and for ``sync``,
which leaves alone what a live process will log itself.

A job folder is known by what it holds, not by its name (``hydra.sweep.subdir`` may be any
path), and as this sweep's by the sweep's id in its record: rerun into the same folder, a
sweep must not count, summarise or log an earlier sweep's jobs, nor older runs below it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from paged_bench.errors import PagedBenchError
from paged_bench.report.load import NOT_RUNS, RUN_INFO, read_json, update_run_info
from paged_bench.results.whole_files import write_whole

SWEEP_FILE = "sweep.json"
STATUS_FILE = RUN_INFO  # every job writes it, with its status, when it ends
SWEEP_ID = "sweep_id"  # the key, in a job's record, of the id of the sweep it belongs to
HYDRA_DIR = ".hydra"  # what Hydra writes into a job's folder as it starts the job
# a job cut off before it recorded its sweep is this sweep's if Hydra started it after the sweep
# began; file times come from a coarser clock than time.time(), and may lag it a little
CLOCK_SLACK_S = 0.5


def sweep_info(sweep_dir: Path) -> dict[str, Any]:
    """What ``start`` wrote in the sweep folder (empty if it did not)."""
    try:
        return json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return {}


def alive_here(record: dict[str, Any]) -> bool:
    """Whether the process a record names (``pid`` and ``host``, as ``sweep.json`` and a job's
    ``run_info.json`` hold them) is alive on this host, other than this one. A process on another
    host cannot be seen from here: False, and the callers do what they did before they looked."""
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive all the same
        pass
    return not _started_after(pid, record.get("start_time"))


def _started_after(pid: int, when: Any) -> bool:
    """Whether process ``pid`` started after ``when`` (a ``time.time()``): then it is not the
    process a record made at that time names, but one that has taken its pid since (read from
    Linux's /proc; where that cannot be read: False)."""
    if not isinstance(when, (int, float)):
        return False
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])  # starttime, field 22
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))  # fmt: skip
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    return boot + ticks / os.sysconf("SC_CLK_TCK") > when + 2.0  # btime is in whole seconds


@contextlib.contextmanager
def locked(sweep_dir: Path) -> Iterator[None]:
    """The sweep folder, locked against other processes on this host for the block: two sweeps
    started at once must not both find it free before either has recorded itself in it."""
    fd = os.open(sweep_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing releases the lock)


def write_info(sweep_dir: Path, info: dict[str, Any]) -> None:
    """Write ``sweep.json`` whole (jobs in other processes read it as they start)."""
    write_whole(sweep_dir / SWEEP_FILE, json.dumps(info, indent=2) + "\n")


def stopping(sweep_dir: Path) -> bool:
    """Whether the sweep was asked to stop: its jobs not started yet must not start."""
    return "stopping" in sweep_info(sweep_dir)


def recorded(overrides: list[str]) -> list[str]:
    """The overrides a run's name and tags may show: not the store settings (``tracking.*``: a
    tracking URI may carry credentials, and MLflow params leave them out too)."""
    return [o for o in overrides if not o.lstrip("+~").startswith("tracking.")]


def job_name(overrides: list[str], sweep_dir: Path | None) -> str:
    """A job's MLflow run name: its own overrides (not Hydra's, not those the sweep shares)."""
    shared = set(sweep_info(sweep_dir).get("shared_keys", [])) if sweep_dir else set()
    own = [o for o in recorded(overrides) if not o.startswith("hydra") and o.split("=", 1)[0] not in shared]
    return " ".join(own) or "default"


def job_info(run_dir: Path) -> dict[str, Any]:
    """What a job recorded in its folder (who runs it, how it ended); empty before it did, or
    while its record cannot be read."""
    try:
        return read_json(run_dir / STATUS_FILE)
    except PagedBenchError:  # a record cut short (report.load raises it for such files)
        return {}


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The folders of this sweep's jobs (the sweep ``sweep.json`` describes; every job folder
    below ``sweep_dir`` if it names none), in launch order."""
    info = sweep_info(sweep_dir)
    jobs = [d for d in _job_folders(sweep_dir) if _of_sweep(d, info)]
    return sorted(jobs, key=_launch_order)


def _job_folders(path: Path, depth: int = 4) -> Iterator[Path]:
    """Folders below ``path`` where Hydra started a job or a job recorded itself (walked as
    ``report.load.find_runs`` walks runs: not into copies of runs' files)."""
    for child in path.iterdir() if path.is_dir() and depth else ():
        if child.is_dir() and child.name not in NOT_RUNS and not child.name.startswith("."):
            holds_job = (child / HYDRA_DIR).is_dir() or (child / STATUS_FILE).is_file()
            yield from [child] if holds_job else _job_folders(child, depth - 1)


def _of_sweep(run_dir: Path, info: dict[str, Any]) -> bool:
    """Whether the job in ``run_dir`` is the sweep's: it recorded the sweep's id (a single run
    records none), or, cut off before it recorded who it is, Hydra started it after the sweep
    began."""
    if "id" not in info:
        return True
    recorded = job_info(run_dir)
    if SWEEP_ID in recorded:
        return recorded[SWEEP_ID] == info["id"]
    try:
        return (run_dir / HYDRA_DIR / "hydra.yaml").stat().st_mtime >= info["started"] - CLOCK_SLACK_S
    except (OSError, KeyError, TypeError):
        return False


def job_num(run_dir: Path) -> int | None:
    """A job's number in its sweep: what it recorded, else what Hydra recorded as it started it."""
    num = job_info(run_dir).get("job_num")
    if num is None:
        num = ((_hydra_file(run_dir, "hydra.yaml") or {}).get("hydra") or {}).get("job", {}).get("num")
    return num if isinstance(num, int) else None


def _launch_order(run_dir: Path) -> tuple[float, str]:
    num = job_num(run_dir)
    return math.inf if num is None else num, run_dir.name


def job_counts(sweep_dir: Path) -> tuple[int, int]:
    """(jobs ended, jobs that did not finish) from what this sweep's jobs recorded."""
    ended = [job_info(d).get("status") for d in job_dirs(sweep_dir)]
    ended = [status for status in ended if status is not None]
    return len(ended), sum(status != "finished" for status in ended)


def started_jobs(sweep_dir: Path) -> list[Path]:
    """This sweep's job folders (Hydra makes one as it starts a job) that have not recorded their end."""
    return [d for d in job_dirs(sweep_dir) if "status" not in job_info(d)]


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
            overrides = list(_hydra_file(run_dir, "overrides.yaml") or [])
            fields.update(run_name=job_name(overrides, sweep_dir), job_num=job_num(run_dir))
        update_run_info(run_dir, fields)


def _withdraw(run_dir: Path) -> bool:
    """Remove the folder Hydra made for a job that never began (a launcher handed it out as
    the sweep stopped: only Hydra's files, its log empty), so that it counts as not run."""
    logs = list(run_dir.glob("*.log"))
    hydra_files = {HYDRA_DIR, *(p.name for p in logs)}
    if {p.name for p in run_dir.iterdir()} - hydra_files or any(p.stat().st_size for p in logs):
        return False
    for path in logs:
        path.unlink()
    shutil.rmtree(run_dir / HYDRA_DIR, ignore_errors=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()
    return not run_dir.exists()


def _hydra_file(run_dir: Path, name: str) -> Any:
    """One of the files Hydra wrote as it started the job (None if it wrote none)."""
    import yaml

    try:
        return yaml.safe_load((run_dir / HYDRA_DIR / name).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
