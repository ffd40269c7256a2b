"""The life of a sweep (``python -m paged_bench -m ...``), as a Hydra callback.

When the sweep starts: count its jobs, open the MLflow parent run, and write ``sweep.json``
into the sweep folder (the parent run, this process and host) so that every job, in whichever
process or machine the launcher puts it, knows who logs it (see ``track``). While it runs: a
progress bar of finished jobs. When it ends, also when jobs failed or it was interrupted:
every job folder on this host is logged as a child (a job cut off before it recorded its end
as interrupted), the summary table (CSV + markdown) and comparison plots go to
``<sweep>/report`` and onto the parent run, which is then closed; the table is printed, and
the command exits non-zero if any job that started failed.

Hydra 1.3 skips ``on_multirun_end`` when a job raises; the CLI then calls ``finish`` itself
(``KILLED`` after Ctrl-C, ``FAILED`` otherwise), and an ``atexit`` hook is the last resort, so
a parent run is never left RUNNING.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from paged_bench.cli import signals
from paged_bench.report.load import RUN_INFO, read_json
from paged_bench.tracking.runs import SWEEP_DIR_TAG

SWEEP_FILE = "sweep.json"
STATUS_FILE = RUN_INFO  # every job writes it, with its status, when it ends


@dataclass
class _Sweep:
    sweep_dir: Path
    total: int | None
    experiment: str
    link: dict[str, str] | None  # the parent run (tracking.runs.Link as a dict), None when untracked
    bar: Any  # progress.SweepBar | None
    settings: dict[str, Any] = field(default_factory=dict)  # tracking.*
    submitted: set[Path] = field(default_factory=set)  # job folders handed to the tracking helper


_active: _Sweep | None = None
_outcome: tuple[int, int] | None = None  # (failed, jobs) of the last sweep this process ended


def _overrides(config: DictConfig) -> list[Any]:
    """The sweep's overrides as the basic sweeper sees them: ``hydra.sweeper.params``, then
    the command line's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    lines = [f"{k}={v}" for k, v in params.items()] + list(OmegaConf.select(config, "hydra.overrides.task") or [])
    return OverridesParser.create().parse_overrides(lines)


def job_overrides(config: DictConfig) -> list[list[str]]:
    """Each job's overrides, in launch order, as the basic sweeper expands them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return [job for batch in BasicSweeper.split_arguments(_overrides(config), None) for job in batch]


def count_jobs(config: DictConfig) -> int | None:
    """How many jobs the basic sweeper will launch (None for other sweepers)."""
    if not str(OmegaConf.select(config, "hydra.sweeper._target_") or "").endswith("BasicSweeper"):
        return None
    try:
        return len(job_overrides(config))
    except Exception:  # noqa: BLE001  (a total is a nicety; the sweeper reports bad overrides itself)
        return None


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


def job_name(overrides: list[str], sweep_dir: Path | None) -> str:
    """A job's MLflow run name: its own overrides (not Hydra's, not those the sweep shares)."""
    shared = set(sweep_info(sweep_dir).get("shared_keys", [])) if sweep_dir else set()
    own = [o for o in overrides if not o.startswith("hydra") and o.split("=", 1)[0] not in shared]
    return " ".join(own) or "default"


def sweep_info(sweep_dir: Path) -> dict[str, Any]:
    """What ``start`` wrote in the sweep folder (empty if it did not)."""
    try:
        return json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return {}


def start(config: DictConfig) -> None:
    signals.install(signals.WITH_CTRL_C, _on_stop)
    with signals.deferred(raise_after=True):  # a signal now stops the sweep once it can be closed
        _start(config)


def _start(config: DictConfig) -> None:
    global _active, _outcome
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    total = count_jobs(config)
    _check_parallel(config, total)
    experiment = OmegaConf.select(config, "experiment_name") or "paged_bench"
    settings = OmegaConf.to_container(config.tracking, resolve=True) if "tracking" in config else {}
    # +experiment=NAME -> param experiment (MLflow keys take no +/~)
    spec = {str(o.get_key_element()).lstrip("+~"): _value_text(o) for o in _safe_overrides(config)}
    tags = {SWEEP_DIR_TAG: str(sweep_dir), "jobs": str(total or ""), "overrides": " ".join(config.hydra.overrides.task)}
    info: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname(), "total_jobs": total,
                            "started": time.time(), "experiment": experiment, "run_name": f"sweep {experiment} {sweep_dir.name}",
                            "params": spec, "tags": tags}  # fmt: skip
    # what every job shares (e.g. +experiment=...): a job's name is what is left, its own settings
    info["shared_keys"] = [o.get_key_element() for o in _safe_overrides(config) if not o.is_sweep_override()]
    link = _open_parent(settings, info) if settings.get("enabled", True) else None
    info["tracking"] = link
    write_info(sweep_dir, info)
    from paged_bench.cli.progress import SweepBar

    _active = _Sweep(sweep_dir, total, experiment, link, SweepBar(sweep_dir, total, job_counts), settings)
    _outcome = None
    atexit.register(_at_exit)


def _on_stop(signum: int) -> None:
    """Before the sweep stops: its jobs running in other processes get the signal and a
    moment to record what they measured (jobs that start meanwhile are not waited for)."""
    sweep = _active
    if sweep is not None:
        write_info(sweep.sweep_dir, {**sweep_info(sweep.sweep_dir), "stopping": signal.Signals(signum).name})
        # jobs whose process recorded who it is: those that are not yet importing, building
        running = [d for d in _started_jobs(sweep.sweep_dir) if "pid" in sweep_info_of_job(d)]
        signals.pass_on(signum, _job_pids(running), lambda: all("status" in sweep_info_of_job(d) for d in running))


def stopping(sweep_dir: Path) -> bool:
    """Whether the sweep was asked to stop: its jobs not started yet must not start."""
    return "stopping" in sweep_info(sweep_dir)


def _job_pids(run_dirs: list[Path]) -> list[int]:
    """The processes on this host, other than this one, that run these jobs (each job
    records its own: ``job.run``)."""
    host, me = socket.gethostname(), os.getpid()
    infos = [sweep_info_of_job(d) for d in run_dirs]
    return [i["pid"] for i in infos if i.get("host") == host and isinstance(i.get("pid"), int) and i["pid"] != me]


def _started_jobs(sweep_dir: Path) -> list[Path]:
    """Job folders (Hydra makes one as it starts a job) that have not recorded their end."""
    from paged_bench.report.load import is_run_dir

    jobs = [d for d in sweep_dir.iterdir() if d.name.isdigit() and is_run_dir(d)]
    return [d for d in jobs if "status" not in sweep_info_of_job(d)]


def _stop_local_workers() -> None:
    """Shut joblib's worker pool down in order after an interrupted sweep (killed under it,
    its semaphores would be reported as leaked at exit)."""
    loky = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(loky, "_executor", None)
    if executor is not None:
        try:
            executor.shutdown(wait=True, kill_workers=True)
        except Exception:  # noqa: BLE001, S110  (best effort: the sweep is closing anyway)
            pass


def _check_parallel(config: DictConfig, total: int | None) -> None:
    """Jobs side by side learn their share of the cores; a sweep that would oversubscribe
    them for wall-clock backends stops here, before any job (Hydra only warns about a
    callback's exceptions, so this one exits)."""
    from paged_bench.cli import parallel
    from paged_bench.errors import ConfigError

    try:
        jobs = job_overrides(config) if total is not None else []
    except Exception:  # noqa: BLE001  (the sweeper reports bad overrides itself)
        jobs = []
    try:
        parallel.prepare(config, jobs, total)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_code) from e


def write_info(sweep_dir: Path, info: dict[str, Any]) -> None:
    """Write ``sweep.json`` whole (jobs in other processes read it as they start)."""
    path = sweep_dir / SWEEP_FILE
    part = path.with_name(f".{SWEEP_FILE}.{os.getpid()}")
    part.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(part, path)


def _open_parent(settings: dict[str, Any], info: dict[str, Any]) -> dict[str, str] | None:
    """The parent run, created by this process's tracking helper; None if the store failed."""
    from paged_bench.tracking import store, uploader

    if store.failure():
        return None
    try:
        reply = uploader.shared().request("sweep_start", uri=store.resolve_uri(settings.get("uri")),
                                          experiment=info["experiment"], run_name=info["run_name"],
                                          tags=info["tags"], params=info["params"])  # fmt: skip
    except uploader.UploadError as e:  # a sweep runs without tracking rather than not at all
        store.report_failure(e, info["tags"][SWEEP_DIR_TAG])
        return None
    return reply["link"] if reply else None


def submit_job(run_dir: Path) -> None:
    """Log a job of the active sweep that ran in this process, without waiting for it."""
    if _active is not None:
        _submit(_active, run_dir)


def _submit(sweep: _Sweep, run_dir: Path) -> None:
    if sweep.link is None:
        return
    from paged_bench.cli.track import wants_plots
    from paged_bench.tracking import uploader

    sweep.submitted.add(run_dir.resolve())
    try:
        uploader.shared().request("run", wait=False, run_dir=str(run_dir.resolve()), settings=sweep.settings,
                                  plots=wants_plots(sweep.settings, True), parent=sweep.link)  # fmt: skip
    except uploader.UploadError as e:
        from paged_bench.tracking import store

        store.report_failure(e, str(run_dir))


def _safe_overrides(config: DictConfig) -> list[Any]:
    try:
        return _overrides(config)
    except Exception:  # noqa: BLE001  (the sweeper reports bad overrides itself)
        return []


def _value_text(override: Any) -> str:
    if override.is_sweep_override():
        return ",".join(override.sweep_string_iterator())
    return str(override.value())


def finish(status: str | None = None) -> tuple[int, int] | None:
    """End the active sweep: every job logged, summary and plots, parent run closed with
    ``status`` (default: FINISHED, or FAILED when a job failed). Returns (failed, jobs); None
    if no sweep was active. Jobs that never started are not counted as failed."""
    global _active
    sweep, _active = _active, None
    if sweep is None:
        return None
    with signals.deferred():
        return _finish(sweep, status)


def _finish(sweep: _Sweep, status: str | None) -> tuple[int, int]:
    global _outcome
    if sweep.bar is not None:
        sweep.bar.close()
    if status == "KILLED":
        _stop_local_workers()
    _record_unfinished(sweep.sweep_dir, "was stopped" if status == "KILLED" else "ended")
    _submit_rest(sweep)
    failed, jobs, not_run, files, note = _summarize(sweep)
    final = status or ("FAILED" if failed else "FINISHED")
    info = sweep_info(sweep.sweep_dir)
    write_info(sweep.sweep_dir, {**info, "ended": time.time(), "status": final})
    if sweep.link is not None:
        _close_parent(sweep, final, files, {"jobs": str(jobs), "failed_jobs": str(failed),
                                            "jobs_not_run": str(not_run), **({"mlflow.note.content": note} if note else {})})  # fmt: skip
    _outcome = (failed, jobs)
    return _outcome


def _record_unfinished(sweep_dir: Path, how: str) -> None:
    """A job that started (Hydra made its folder) but never recorded how it ended was cut off
    with its process: it is recorded as interrupted, so it is logged and counted; in a stopped
    sweep, one that never began (only Hydra's files) is withdrawn, and counted as not run."""
    from paged_bench.report.load import update_run_info

    for run_dir in _started_jobs(sweep_dir):
        fields = {"status": "interrupted", "error": f"the sweep {how} before the job did", "end_time": time.time()}
        if "run_name" not in sweep_info_of_job(run_dir):  # cut off before it knew its name
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


def sweep_info_of_job(run_dir: Path) -> dict[str, Any]:
    return read_json(run_dir / STATUS_FILE)


def _submit_rest(sweep: _Sweep) -> None:
    """Hand every job folder the sweep's process has not logged yet to its tracking helper
    (jobs that ran in other processes on this host)."""
    from paged_bench.report.load import find_runs

    for run in find_runs(sweep.sweep_dir, depth=1):
        if run.path.resolve() not in sweep.submitted:
            _submit(sweep, run.path)


def _close_parent(sweep: _Sweep, status: str, files: list[Path], tags: dict[str, str]) -> None:
    """Wait for the jobs' uploads, then attach the summary to the parent and close it."""
    from paged_bench.tracking import store, uploader

    tags[SWEEP_DIR_TAG] = str(sweep.sweep_dir)
    try:
        uploader.shared().request("sweep_finish", link=sweep.link, status=status,
                                  artifacts=[str(f) for f in files], tags=tags)  # fmt: skip
    except uploader.UploadError as e:
        store.report_failure(e, str(sweep.sweep_dir))
    uploader.close_shared()


def _summarize(sweep: _Sweep) -> tuple[int, int, int, list[Path], str | None]:
    """Build and print the sweep's report; a report that cannot be built must not keep the
    parent run open, so its failure is printed and the sweep still closes."""
    from paged_bench.report.load import REPORT_DIR, find_runs

    runs = find_runs(sweep.sweep_dir)
    failed = sum(r.status != "finished" for r in runs)
    jobs = max(len(runs), sweep.total or 0)
    not_run = jobs - len(runs)  # an interrupted sweep's jobs that never started
    try:
        from paged_bench.cli.catalog import experiment_description
        from paged_bench.report.build import build_report

        report = build_report(runs, sweep.sweep_dir / REPORT_DIR, title=sweep.experiment,
                              description=experiment_description(sweep.experiment))  # fmt: skip
    except Exception as e:  # noqa: BLE001  (the parent run must still be closed)
        print(f"warning: the sweep report could not be built: {type(e).__name__}: {e}", file=sys.stderr)
        return failed, jobs, not_run, [], None
    not_run_text = f", {not_run} not run" if not_run else ""
    print(f"\nsweep {sweep.experiment}: {jobs} job(s), {failed} not finished{not_run_text} -> {sweep.sweep_dir}")
    print(report.table)
    print(f"report: {report.out_dir / 'report.md'}")
    return failed, jobs, not_run, report.files, report.markdown


def failed_jobs() -> tuple[int, int] | None:
    """(failed, jobs) of the sweep this process ended last, if it had failures."""
    return _outcome if _outcome and _outcome[0] else None


def _at_exit() -> None:
    if _active is not None:
        finish("FAILED")


class SweepCallback(Callback):
    """Registered in ``hydra.callbacks`` (conf/config.yaml); does nothing for single runs."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        start(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        finish()
