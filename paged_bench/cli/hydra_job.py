"""One job of the command line under Hydra: run it, print it, log it, exit as it went.

``run`` is what ``python -m paged_bench`` does for each job (one, or each of a sweep): resolve
the config, run ``app.run_job`` with a progress bar, print the summary, log the run to
MLflow (a sweep's jobs as children of its parent run, see ``sweep``), and turn a failure into
one line on stderr and a non-zero exit (in a sweep the other jobs go on instead; the sweep's
exit status says it failed). A job that measured nothing still leaves its status file. A run
folder that cannot be written (a full disk) is such a failure too, not a bug: one line naming
the path, and the job's record kept where it still can be. Hydra
reuses a job's folder (the same ``hydra.run.dir``, a sweep rerun into its folder): a job first
clears what an earlier run wrote there, so that its results cannot pass for this job's.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from paged_bench.cli import signals, sweep_folder
from paged_bench.cli.progress import JobBar, echo
from paged_bench.cli.sweep_jobs import chdir_refused, override_keys, unswept_params
from paged_bench.cli.track import track_job
from paged_bench.errors import PagedBenchError
from paged_bench.report.load import (
    CONFIG_FILE,
    REPORT_DIR,
    RUN_INFO,
    TRACKING_URI_KEY,
    save_config,
    update_run_info,
)
from paged_bench.results.run_files import format_summary
from paged_bench.results.whole_files import cannot_write
from paged_bench.run.job import run_job
from paged_bench.run.outcome import JobOutcome
from paged_bench.run.tracking_settings import TrackingSettings
from paged_bench.tracking.store import recorded_uri

# what a run writes into its folder (outputs.write_run, a cluster's replicas.csv, its config,
# its plots, a report of it, the server it spawned): never another tool's files
RESULTS = ("summary.json", "requests.csv", "steps.csv", "replicas.csv", RUN_INFO, CONFIG_FILE, "plots", REPORT_DIR,
           "server")  # fmt: skip


@dataclass
class Job:
    """Where a job stands: its folder, and its place in a sweep if it is in one."""

    run_dir: Path
    multirun: bool
    sweep_dir: Path | None
    num: int | None
    name: str  # its overrides, or "default": the MLflow run name
    sweep: dict[str, Any] = field(default_factory=dict)  # what its sweep's sweep.json says
    options: dict[str, str] = field(default_factory=dict)  # the config option per group (workload=seed)
    unswept: str | None = None  # why a config that defines a sweep cannot run as one job
    chdir: bool = False  # hydra.job.chdir: Hydra changed into the job's folder (refused)
    overrides: list[str] = field(default_factory=list)  # its command line's, less the store's and Hydra's
    config: dict[str, Any] | None = None  # resolved, once it is
    tracking: TrackingSettings | None = None  # read from it, once they are checked

    @classmethod
    def current(cls) -> Job:
        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        sweep_dir = Path(hc.sweep.dir).resolve() if multirun else None
        # the overrides as typed: 'max_batch=${nope}' must not be resolved here, where its
        # error would be a traceback (run reports it as the config's, in one line)
        task = OmegaConf.to_container(hc.overrides.task, resolve=False)
        return cls(
            run_dir=Path(hc.runtime.output_dir),
            multirun=multirun,
            sweep_dir=sweep_dir,
            num=hc.job.num if multirun else None,
            name=sweep_folder.job_name(task, sweep_dir),
            sweep=sweep_folder.sweep_info(sweep_dir) if sweep_dir else {},
            options=_options(hc.runtime.choices, task),
            unswept=None if multirun else _sweep_without_multirun(dict(hc.sweeper.params or {}), task),
            chdir=bool(hc.job.chdir),
            overrides=[o for o in sweep_folder.recorded(task) if not o.startswith("hydra")],
        )

    def record(self, started: float) -> dict[str, Any]:
        """Who the job is, in its ``run_info.json``: what tracking, ``sync`` and its sweep
        know it by."""
        return {"run_name": self.name, "job_num": self.num, sweep_folder.SWEEP_ID: self.sweep.get("id"),
                "start_time": started, "overrides": self.overrides, **_store_of(self.config or {})}  # fmt: skip

    @property
    def label(self) -> str:
        return f"#{self.num} {self.name}" if self.multirun else self.name


def quiet_stdout() -> None:
    """Point stdout at /dev/null once its reader is gone (``| head``), so that later writes
    and the interpreter's final flush cannot fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _fail(message: str, code: int, job: Job) -> None:
    print(f"error: {'job ' + job.label + ': ' if job.multirun else ''}{message}", file=sys.stderr)
    if not job.multirun:  # in a sweep the other jobs go on; the sweep's exit status says it failed
        sys.exit(code)


def _interrupted_before_measuring(job: Job, e: KeyboardInterrupt) -> str:
    name = signal.Signals(getattr(e, "signum", signal.SIGINT)).name
    if (job.run_dir / "summary.json").is_file():
        return f"interrupted by {name}"
    return f"interrupted by {name} before the engine ran: nothing was measured"


def clear_results(run_dir: Path) -> None:
    """Remove what an earlier run wrote into ``run_dir`` (``RESULTS``), other files kept; only
    where a run left its record (``hydra.run.dir=.`` must not cost a project its report/)."""
    if not any((run_dir / name).is_file() for name in (RUN_INFO, "summary.json")):
        return
    for path in (run_dir / name for name in RESULTS):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _options(choices: Mapping[str, Any], overrides: list[str]) -> dict[str, str]:
    """The option picked per config group (``workload=seed``), which names the run's plugins,
    less the groups whose plugin the overrides renamed: ``router.name=least_kv`` runs least_kv
    under the option round_robin, so the plugin's own name labels it."""
    renamed = {key.removesuffix(".name") for key in override_keys(overrides) if key.endswith(".name")}
    return {k: str(v) for k, v in choices.items() if v is not None and k not in renamed}


def _sweep_without_multirun(params: dict[str, str], overrides: list[str]) -> str | None:
    """A config that defines a sweep (``+experiment=X``) run without ``-m`` would silently be
    one run of its defaults: say so, unless every swept key was given one value."""
    missing = unswept_params(params, overrides)
    if not missing:
        return None
    swept = " ".join(f"{k}={v}" for k, v in missing.items())
    return f"this config is a sweep ({swept}): run it with -m, or give each of those keys one value"


def _record(job: Job, started: float, status: str, error: str | None, **extra: Any) -> None:
    """The job's own record in ``run_info.json`` (a job that measured nothing still leaves its
    status, so the sweep counts it): what tracking and ``sync`` log it by."""
    fields = {**job.record(started), "end_time": time.time(), **extra}
    if status != "finished" or error:
        fields.update(status=status, error=error)
    update_run_info(job.run_dir, fields)


def _record_what_it_can(job: Job, started: float, status: str, error: str | None, **extra: Any) -> None:
    """``_record`` after a failure: where the record cannot be written either (a full disk),
    the failure being reported says so; a second error here would only hide it."""
    with suppress(OSError):
        _record(job, started, status, error, **extra)


def _end(job: Job, started: float, status: str, error: str | None) -> None:
    _record(job, started, status, error)
    _track(job)


def _unwritable(e: BaseException, job: Job) -> str | None:
    """The one line for an OSError writing the job's folder (the path the OS named is in it);
    None for any other error, which stays a bug with its traceback."""
    if not isinstance(e, OSError) or e.filename is None or isinstance(e.filename, int):
        return None
    path, folder = os.path.abspath(os.fsdecode(e.filename)), os.path.abspath(job.run_dir)
    return cannot_write(e) if os.path.commonpath([path, folder]) == folder else None


def _track(job: Job) -> None:
    """Log the job as its tracking settings say; a job whose settings were refused is not
    logged by its own process (a sweep's process logs every job folder as the sweep ends)."""
    if job.tracking is not None:
        track_job(job.tracking, job.run_dir, job.sweep_dir if job.multirun else None)


def _thread_lock_for_tqdm() -> None:
    """In a launcher's worker process, tqdm's lock need not span processes: its default (a
    multiprocessing lock) is a named semaphore that a worker killed after Ctrl-C leaks."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def _job_line(job: Job, outcome: JobOutcome) -> str:
    s = outcome.summary

    def num(key: str, fmt: str) -> str:
        return "n/a" if s.get(key) is None else fmt.format(s[key])

    return (f"{job.label}: {outcome.status}, {s.get('completed')}/{s.get('failed')} requests done/failed, "
            f"{num('output_throughput', '{:,.0f}')} tok/s, TTFT p50 {num('median_ttft_ms', '{:,.0f}')} ms")  # fmt: skip


def run(cfg: DictConfig) -> None:
    """One Hydra job: resolve the config, run it, print it, log it, exit as it went."""
    job = Job.current()
    started = time.time()
    try:
        _run(cfg, job, started)
    except OSError as e:
        if (message := _unwritable(e, job)) is None:
            raise
        _record_what_it_can(job, started, "failed", message)
        _track(job)  # logged with what it wrote, as a job that failed otherwise is
        _fail(message, 1, job)


def _store_of(config: Mapping[str, Any]) -> dict[str, str]:
    """The store the job is meant for, as ``run_info.json`` records it for a later ``sync`` (which
    uploads it there, and to another store only when told to): ``tracking.uri``, else
    ``$MLFLOW_TRACKING_URI``, else the embedded store, absolute, as the job read them."""
    return {TRACKING_URI_KEY: recorded_uri((config.get("tracking") or {}).get("uri"))}


def _refuse(message: str, job: Job, started: float) -> None:
    """A command refused before its config resolved: recorded as such in its folder, so that a
    later ``sync`` leaves it out (it ran nothing), and failed with exit status 2."""
    _record_what_it_can(job, started, "failed", message, refused=True)
    _fail(message, 2, job)


def _run(cfg: DictConfig, job: Job, started: float) -> None:
    if job.chdir:
        return _refuse(str(chdir_refused()), job, started)
    if job.unswept:
        return _refuse(job.unswept, job, started)
    holder = sweep_folder.job_info(job.run_dir)
    if not job.multirun and sweep_folder.alive_here(holder):  # clearing it would delete a live run's results
        return _fail(f"{job.run_dir} is in use by a running job (pid {holder['pid']}): use another hydra.run.dir, "
                     "or wait for it", 2, job)  # fmt: skip
    clear_results(job.run_dir)
    in_sweep_process = job.multirun and job.sweep.get("pid") == os.getpid()
    if job.multirun and not in_sweep_process:
        signals.note_between_jobs()
        _thread_lock_for_tqdm()
    if job.multirun and (signals.received() is not None or sweep_folder.stopping(job.sweep_dir)):
        # handed out as the sweep stopped: not run (it writes nothing; the sweep withdraws
        # Hydra's folder for it), and the worker tells its launcher to stop
        raise KeyboardInterrupt
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:  # an interpolation that resolves to nothing
        where = getattr(e, "full_key", None)
        message = (f"{where}: " if where else "") + str(e).splitlines()[0]
        if not job.multirun:
            return _refuse(message, job, started)
        _record_what_it_can(job, started, "failed", message)
        return _fail(message, 2, job)
    # who the job is, before its config and before it runs: a job cut off with its process is
    # still logged by name, and the sweep's process passes a signal on to the process running it
    # (with the options picked: a job that fails to build is labelled as one that ran, workload=seed)
    options = {k: v for k, v in job.options.items() if not k.startswith("hydra/")}
    update_run_info(job.run_dir, {**job.record(started), **_store_of(config), "pid": os.getpid(),
                                  "host": socket.gethostname(), "choices": options})  # fmt: skip
    save_config(job.run_dir, config)
    job.config = config
    bar = JobBar(enabled=not job.multirun or in_sweep_process, nested=job.multirun)
    try:
        job.tracking = TrackingSettings.from_config(config)  # found after the run, a bad one would cost its tracking
        with signals.stop_on_signals(signals.WITH_CTRL_C):
            # what the engine measured is written whole: a signal meanwhile waits for it
            outcome = run_job(config, job.run_dir, bar if bar.shown else None, options=job.options,
                              shield=signals.deferred)  # fmt: skip
    except PagedBenchError as e:  # bad config or plugin: nothing ran
        bar.close()
        if job.multirun:  # the sweep's table in MLflow shows which combination failed
            _record_what_it_can(job, started, "failed", str(e))
            _track(job)
        else:  # a command refused: not logged, now or by a later sync (its folder keeps the record)
            _record_what_it_can(job, started, "failed", str(e), refused=True)
        return _fail(str(e), e.exit_code, job)
    except BaseException as e:  # Ctrl-C before the engine loop, or a bug: record it, let it through
        bar.close()
        if isinstance(e, KeyboardInterrupt):
            _record_what_it_can(job, started, "interrupted", _interrupted_before_measuring(job, e))
            _track(job)
        elif _unwritable(e, job) is None:  # (a folder that cannot be written is recorded by run)
            _record_what_it_can(job, started, "failed", f"{type(e).__name__}: {e}")
            _track(job)
        raise
    bar.close()
    if job.multirun:
        echo(_job_line(job, outcome))
    else:
        choices = ", ".join(f"{k}={job.options.get(k, v)}" for k, v in outcome.choices.items())
        try:
            print(format_summary(outcome.summary, f"{choices} -> {outcome.run_dir}"), flush=True)
        except BrokenPipeError:  # `| head`: the reader is gone; the run is still logged
            quiet_stdout()
    _end(job, started, outcome.status, outcome.error)
    if signals.received() is not None and outcome.status != "interrupted":
        raise KeyboardInterrupt  # it came as the job wrote what it measured: recorded as it ended, now stop
    if outcome.error:
        if outcome.status == "interrupted" and job.multirun:
            raise KeyboardInterrupt  # Ctrl-C stops the whole sweep, not just this job
        _fail(f"run {outcome.status}: {outcome.error} (results so far are in {outcome.run_dir})",
              signals.exit_status() if outcome.status == "interrupted" else 1, job)  # fmt: skip
