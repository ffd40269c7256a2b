"""The life of a sweep (``python -m paged_bench -m ...``), as a Hydra callback.

When the sweep starts: count its jobs and check them (``sweep_jobs``), open the MLflow
parent run, and write ``sweep.json`` into the sweep folder (the sweep's id, the parent run,
this process and host) so that every job, in whichever process or machine the launcher puts
it, knows who logs it (see ``track``). While it
runs: a progress bar of finished jobs. When it ends, also when jobs failed or it was
interrupted: every job folder of this sweep on this host is logged as a child (a job cut off
before it recorded its end as interrupted), the summary table (CSV + markdown) and comparison
plots go to ``<sweep>/report`` and onto the parent run, which is then closed; the table is
printed, and the command exits non-zero if any job that started failed. Only this sweep's
jobs count: not an earlier sweep's in the same folder, nor older runs below it; a folder that
a sweep still running on this host holds is refused in one line (exit 2) before any job.

Hydra 1.3 skips ``on_multirun_end`` when a job raises; the CLI then calls ``finish`` itself
(``KILLED`` after Ctrl-C, ``FAILED`` otherwise), and an ``atexit`` hook is the last resort, so
a parent run is never left RUNNING. What the sweep's processes share on disk (``sweep.json``,
each job's record) is read and written by ``sweep_folder``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from paged_bench.cli import signals
from paged_bench.cli import sweep_folder as folder
from paged_bench.cli.catalog import experiment_description
from paged_bench.cli.progress import SweepBar
from paged_bench.cli.sweep_jobs import check_jobs, count_jobs, safe_overrides, value_text
from paged_bench.errors import PagedBenchError
from paged_bench.report.document import build_report
from paged_bench.report.load import REPORT_DIR, TRACKING_URI_KEY, Run, load_run
from paged_bench.run.tracking_settings import TrackingSettings
from paged_bench.tracking import store, ui, uploader
from paged_bench.tracking.runs import SWEEP_DIR_TAG


@dataclass
class _Sweep:
    sweep_dir: Path
    total: int | None
    experiment: str
    link: dict[str, str] | None  # the parent run (tracking.runs.Link as a dict), None when untracked
    bar: SweepBar | None
    tracking: TrackingSettings = field(default_factory=TrackingSettings)
    submitted: set[Path] = field(default_factory=set)  # job folders handed to the tracking helper


_active: _Sweep | None = None
_outcome: tuple[int, int] | None = None  # (failed, jobs) of the last sweep this process ended


def start(config: DictConfig) -> None:
    signals.install(signals.WITH_CTRL_C, _on_stop)
    with signals.deferred(raise_after=True):  # a signal now stops the sweep once it can be closed
        _start(config)


def _start(config: DictConfig) -> None:
    global _active, _outcome
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    _refuse_busy(sweep_dir)  # before anything else: a sweep refused touches nothing
    total = count_jobs(config)
    tracking = check_jobs(config, total)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if _claim(sweep_dir):  # an earlier sweep's folder: its report must not pass for this one's
        shutil.rmtree(sweep_dir / REPORT_DIR, ignore_errors=True)
    experiment = tracking.experiment
    # +experiment=NAME -> param experiment (MLflow keys take no +/~)
    spec = {str(o.get_key_element()).lstrip("+~"): value_text(o) for o in safe_overrides(config)}
    spec = {k: v for k, v in spec.items() if not k.startswith("tracking.")}  # the store is no param
    overrides = " ".join(folder.recorded(list(config.hydra.overrides.task)))
    tags = {SWEEP_DIR_TAG: str(sweep_dir), "jobs": str(total or ""), "overrides": overrides, **_launcher_tags(config)}
    info: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname(), "total_jobs": total,
                            "started": time.time(), "experiment": experiment, "run_name": f"sweep {experiment} {sweep_dir.name}",
                            "params": spec, "tags": tags}  # fmt: skip
    info["id"] = uuid.uuid4().hex  # what this sweep's jobs record, to be told from an earlier sweep's
    # what every job shares (e.g. +experiment=...): a job's name is what is left, its own settings
    info["shared_keys"] = [o.get_key_element() for o in safe_overrides(config) if not o.is_sweep_override()]
    info[TRACKING_URI_KEY] = store.recorded_uri(tracking.uri)  # the store it is meant for: a later sync's
    link = _open_parent(tracking, info) if tracking.enabled else None
    info["tracking"] = link
    folder.write_info(sweep_dir, info)
    _active = _Sweep(sweep_dir, total, experiment, link, SweepBar(sweep_dir, total, folder.job_counts), tracking)
    _outcome = None
    atexit.register(_at_exit)


def _refuse_busy(sweep_dir: Path) -> None:
    """A sweep still running in this folder would lose its results without a word: each job
    of this one clears its job folder, and its jobs and report would be taken for this one's."""
    info = folder.sweep_info(sweep_dir)
    if folder.alive_here(info):
        print(f"error: {sweep_dir} is in use by a running sweep (pid {info['pid']}): use another "
              "hydra.sweep.dir, or wait for it", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)


def _claim(sweep_dir: Path) -> dict[str, Any]:
    """Record this process in ``sweep.json`` under the folder's lock, so that of two sweeps
    started into it at once the second is refused (this one's whole record comes once its
    parent run is open, seconds later); the earlier sweep's record, the rest of it kept until then."""
    with folder.locked(sweep_dir):
        _refuse_busy(sweep_dir)
        earlier = folder.sweep_info(sweep_dir)
        folder.write_info(sweep_dir, {**earlier, "pid": os.getpid(), "host": socket.gethostname()})
    return earlier


def _on_stop(signum: int) -> None:
    """Before the sweep stops: its jobs running in other processes get the signal and a
    moment to record what they measured (jobs that start meanwhile are not waited for)."""
    sweep = _active
    if sweep is not None:
        folder.write_info(sweep.sweep_dir, {**folder.sweep_info(sweep.sweep_dir), "stopping": signal.Signals(signum).name})
        # jobs whose process recorded who it is: those that are not yet importing, building
        running = [d for d in folder.started_jobs(sweep.sweep_dir) if "pid" in folder.job_info(d)]
        signals.pass_on(signum, folder.job_pids(running), lambda: all("status" in folder.job_info(d) for d in running))


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


def _open_parent(tracking: TrackingSettings, info: dict[str, Any]) -> dict[str, str] | None:
    """The parent run, created by this process's tracking helper; None if the store failed."""
    if store.failure():
        return None
    try:
        reply = uploader.shared().request("sweep_start", uri=store.resolve_uri(tracking.uri),
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
    sweep.submitted.add(run_dir.resolve())
    try:
        uploader.shared().request("run", wait=False, run_dir=str(run_dir.resolve()), settings=sweep.tracking.section(),
                                  plots=sweep.tracking.wants_plots(True), parent=sweep.link)  # fmt: skip
    except uploader.UploadError as e:
        store.report_failure(e, str(run_dir))


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
    folder.record_unfinished(sweep.sweep_dir, "was stopped" if status == "KILLED" else "ended")
    _submit_rest(sweep)
    failed, jobs, not_run, files = _summarize(sweep)
    final = status or ("FAILED" if failed else "FINISHED")
    info = folder.sweep_info(sweep.sweep_dir)
    folder.write_info(sweep.sweep_dir, {**info, "ended": time.time(), "status": final})
    if sweep.link is not None:
        # (its report.md becomes its description as it is closed: tracking.runs.finish_sweep)
        _close_parent(sweep, final, files, {"jobs": str(jobs), "failed_jobs": str(failed), "jobs_not_run": str(not_run)})
    _outcome = (failed, jobs)
    return _outcome


def _submit_rest(sweep: _Sweep) -> None:
    """Hand every job folder the sweep's process has not logged yet to its tracking helper
    (jobs that ran in other processes on this host; the helper skips one ``sync`` uploaded whole)."""
    for run_dir in folder.job_dirs(sweep.sweep_dir):
        if run_dir.resolve() not in sweep.submitted:
            _submit(sweep, run_dir)


def _launcher_tags(config: DictConfig) -> dict[str, str]:
    """How the jobs were launched (``hydra/launcher=joblib hydra.launcher.n_jobs=2``), which
    a wall-clock backend's figures depend on: the launcher and Hydra's own overrides."""
    launcher = OmegaConf.select(config, "hydra.runtime.choices")
    hydra = [o for o in OmegaConf.select(config, "hydra.overrides.hydra", default=[]) or [] if "launcher" in o]
    tags = {"launcher": str((launcher or {}).get("hydra/launcher") or "basic")}
    return tags | ({"launcher_overrides": " ".join(hydra)} if hydra else {})


def _close_parent(sweep: _Sweep, status: str, files: list[Path], tags: dict[str, str]) -> None:
    """Wait for the jobs' uploads, then attach the summary to the parent and close it."""
    tags[SWEEP_DIR_TAG] = str(sweep.sweep_dir)
    try:
        reply = uploader.shared().request("sweep_finish", link=sweep.link, status=status,
                                          artifacts=[str(f) for f in files], tags=tags)  # fmt: skip
    except uploader.UploadError as e:
        store.report_failure(e, str(sweep.sweep_dir))
        reply = None
    uploader.close_shared()
    view = (reply or {}).get("view")
    url = ui.view_url(sweep.link["uri"], sweep.link["experiment_id"], view) if view else None
    if url:  # its jobs as rows, their key figures and swept settings as columns (tracking/ui.py)
        served = " (make ui serves it)" if store.sqlite_path(sweep.link["uri"]) is not None else ""
        print(f"MLflow UI: {url}{served}")


def _summarize(sweep: _Sweep) -> tuple[int, int, int, list[Path]]:
    """Build and print the sweep's report; a report that cannot be built must not keep the
    parent run open, so its failure is printed and the sweep still closes."""
    runs = _job_runs(sweep.sweep_dir)
    failed = sum(r.status != "finished" for r in runs)
    jobs = max(len(runs), sweep.total or 0)
    not_run = jobs - len(runs)  # an interrupted sweep's jobs that never started
    if not runs:  # none started (Hydra refused the batch, or a signal came first): nothing to show
        return failed, jobs, not_run, []
    try:
        report = build_report(runs, sweep.sweep_dir / REPORT_DIR, title=sweep.experiment,
                              description=experiment_description(sweep.experiment))  # fmt: skip
    except Exception as e:  # noqa: BLE001  (the parent run must still be closed)
        print(f"warning: the sweep report could not be built: {type(e).__name__}: {e}", file=sys.stderr)
        return failed, jobs, not_run, []
    not_run_text = f", {not_run} not run" if not_run else ""
    print(f"\nsweep {sweep.experiment}: {jobs} job(s), {failed} not finished{not_run_text} -> {sweep.sweep_dir}")
    if len(report.table.strip().splitlines()) > 2:  # rows under its header: not one job that failed
        print(report.table)
    print(f"report: {report.out_dir / 'report.md'}")
    return failed, jobs, not_run, report.files


def _job_runs(sweep_dir: Path) -> list[Run]:
    """This sweep's jobs as runs to report, numbered as launched (a job folder need not be
    named by its number); one that cannot be read is left out, said so."""
    runs = []
    for run_dir in folder.job_dirs(sweep_dir):
        try:
            runs.append(replace(load_run(run_dir), job=folder.job_num(run_dir)))
        except PagedBenchError as e:
            print(f"warning: {e}", file=sys.stderr)
    return runs


def failed_jobs() -> tuple[int, int] | None:
    """(failed, jobs) of the sweep this process ended last, if it had failures."""
    return _outcome if _outcome and _outcome[0] else None


def forget_last() -> None:
    """Forget the sweep this process ended last (``failed_jobs``): a process that runs commands
    one after another in-process (the tests) starts each as a new process would."""
    global _outcome
    _outcome = None


def _at_exit() -> None:
    if _active is not None:
        finish("FAILED")


class SweepCallback(Callback):
    """Registered in ``hydra.callbacks`` (conf/config.yaml); does nothing for single runs."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        start(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        finish()
