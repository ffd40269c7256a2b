"""One job of the command line under Hydra: run it, print it, log it, exit as it went.

``run`` is what ``python -m paged_bench`` does for each job (one, or each of a sweep): resolve
the config, run ``app.run_job`` with a progress bar, print the summary, log the run to
MLflow (a sweep's jobs as children of its parent run, see ``sweep``), and turn a failure into
one line on stderr and a non-zero exit (in a sweep the other jobs go on instead; the sweep's
exit status says it failed). A job that measured nothing still leaves its status file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from paged_bench.app import JobOutcome, run_job
from paged_bench.cli import sweep
from paged_bench.cli.progress import JobBar, echo
from paged_bench.errors import PagedBenchError
from paged_bench.outputs import format_summary
from paged_bench.report.load import save_config


@dataclass
class Job:
    """Where a job stands: its folder, and its place in a sweep if it is in one."""

    run_dir: Path
    multirun: bool
    sweep_dir: Path | None
    num: int | None
    name: str  # its overrides, or "default": the MLflow run name

    @classmethod
    def current(cls) -> Job:
        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        sweep_dir = Path(hc.sweep.dir).resolve() if multirun else None
        shared = set(sweep.sweep_info(sweep_dir).get("shared_keys", [])) if sweep_dir else set()
        overrides = [o for o in hc.overrides.task if not o.startswith("hydra") and o.split("=", 1)[0] not in shared]
        return cls(
            run_dir=Path(hc.runtime.output_dir),
            multirun=multirun,
            sweep_dir=sweep_dir,
            num=hc.job.num if multirun else None,
            name=" ".join(overrides) or "default",
        )

    @property
    def label(self) -> str:
        return f"#{self.num} {self.name}" if self.multirun else self.name


def _fail(message: str, code: int, job: Job) -> None:
    print(f"error: {'job ' + job.label + ': ' if job.multirun else ''}{message}", file=sys.stderr)
    if not job.multirun:  # in a sweep the other jobs go on; the sweep's exit status says it failed
        sys.exit(code)


def _write_status(job: Job, status: str, error: str) -> None:
    """A job that measured nothing still leaves its status, so the sweep counts it."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    (job.run_dir / sweep.STATUS_FILE).write_text(json.dumps({"status": status, "error": error}, indent=2) + "\n")


def _artifacts(outcome: JobOutcome, settings: dict[str, Any], job: Job) -> list[Path]:
    files = [*outcome.files, outcome.run_dir / "config.yaml"]
    plots = settings.get("plots", "auto")
    # a sweep's jobs skip theirs by default (~1 s each): the parent gets the comparison plots
    if plots is True or (plots == "auto" and not job.multirun):
        try:
            from paged_bench.report.build import run_plots

            if run_plots(outcome.run_dir):
                files.append(outcome.run_dir / "plots")
        except Exception as e:  # noqa: BLE001  (a plot is not worth a run)
            print(f"warning: plots of {outcome.run_dir} failed: {type(e).__name__}: {e}", file=sys.stderr)
    return files


def _track(config: dict[str, Any], job: Job, started: float, status: str, error: str | None,
           outcome: JobOutcome | None = None) -> None:  # fmt: skip
    settings = dict(config.get("tracking") or {})
    if not settings.get("enabled", True):
        return
    parent = None
    if job.multirun and job.sweep_dir is not None:
        on, parent = sweep.read_link(job.sweep_dir)
        if not on:
            return
    from paged_bench.tracking.runs import JobRecord, log_job

    record = JobRecord(config, job.run_dir, status, error, started, job.name)
    record.tags = {"job_num": str(job.num)} if job.multirun else {}
    if outcome is not None:
        record.summary, record.steps = outcome.summary, outcome.result.steps
        record.artifacts = _artifacts(outcome, settings, job)
        record.note = "```\n" + format_summary(outcome.summary) + "\n```"
    else:
        record.artifacts = [job.run_dir / "config.yaml"]
    log_job(record, settings, parent)


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
        config = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        _write_status(job, "failed", str(e).splitlines()[0])
        return _fail(str(e).splitlines()[0], 2, job)
    save_config(job.run_dir, config)
    in_sweep_process = job.sweep_dir is not None and sweep.sweep_info(job.sweep_dir).get("pid") == os.getpid()
    bar = JobBar(enabled=not job.multirun or in_sweep_process, nested=job.multirun)
    try:
        outcome = run_job(config, job.run_dir, bar if bar.shown else None)
    except PagedBenchError as e:  # bad config or plugin: nothing ran
        bar.close()
        _write_status(job, "failed", str(e))
        if job.multirun:  # the sweep's table in MLflow shows which combination failed
            _track(config, job, started, "failed", str(e))
        return _fail(str(e), e.exit_code, job)
    except BaseException as e:  # Ctrl-C outside the engine loop, or a bug: record it, let it through
        bar.close()
        status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        _write_status(job, status, f"{type(e).__name__}: {e}")
        _track(config, job, started, status, f"{type(e).__name__}: {e}")
        raise
    bar.close()
    if job.multirun:
        echo(_job_line(job, outcome))
    else:
        choices = ", ".join(f"{k}={HydraConfig.get().runtime.choices.get(k, v)}" for k, v in outcome.choices.items())
        print(format_summary(outcome.summary, f"{choices} -> {outcome.run_dir}"))
    _track(config, job, started, outcome.status, outcome.error, outcome)
    if outcome.error:
        if outcome.status == "interrupted" and job.multirun:
            raise KeyboardInterrupt  # Ctrl-C stops the whole sweep, not just this job
        _fail(f"run {outcome.status}: {outcome.error} (results so far are in {outcome.run_dir})",
              130 if outcome.status == "interrupted" else 1, job)  # fmt: skip
