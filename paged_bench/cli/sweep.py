"""The life of a sweep (``python -m paged_bench -m ...``), as a Hydra callback.

When the sweep starts: count its jobs, open the MLflow parent run, and write ``sweep.json``
into the sweep folder so that every job, in whichever process or machine the launcher puts
it, logs itself as a child of that run (or knows tracking is off). While it runs: a progress
bar of finished jobs. When it ends, also when jobs failed: the summary table (CSV +
markdown) and comparison plots in ``<sweep>/report``, attached to the parent run, which is
then closed; the table is printed, and the command exits non-zero if any job failed.

Hydra 1.3 skips ``on_multirun_end`` when a job raises; the CLI then calls ``finish`` itself
(``KILLED`` after Ctrl-C, ``FAILED`` otherwise), and an ``atexit`` hook is the last resort, so
a parent run is never left RUNNING.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

SWEEP_FILE = "sweep.json"
STATUS_FILE = "run_info.json"  # every job writes it, with its status, when it ends


@dataclass
class _Sweep:
    sweep_dir: Path
    total: int | None
    experiment: str
    link: Any  # tracking.runs.Link | None
    bar: Any  # progress.SweepBar | None


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


def read_link(sweep_dir: Path) -> tuple[bool, Any]:
    """For a job: (track at all?, the parent run to attach to or None)."""
    info = sweep_info(sweep_dir)
    if not info:
        return True, None  # not started by our callback: the job logs on its own
    link = info.get("tracking")
    if not link or "run_id" not in link:
        return False, None  # tracking off, or the store failed when the sweep started (warned)
    from paged_bench.tracking.runs import Link

    return True, Link(link["uri"], link["experiment_id"], link["run_id"])


def sweep_info(sweep_dir: Path) -> dict[str, Any]:
    """What ``start`` wrote in the sweep folder (empty if it did not)."""
    try:
        return json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return {}


def start(config: DictConfig) -> None:
    global _active, _outcome
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    total = count_jobs(config)
    experiment = OmegaConf.select(config, "experiment_name") or "paged_bench"
    settings = OmegaConf.to_container(config.tracking, resolve=True) if "tracking" in config else {}
    link = None
    if settings.get("enabled", True):
        from paged_bench.tracking.runs import start_sweep

        # +experiment=NAME -> param experiment (MLflow keys take no +/~)
        spec = {str(o.get_key_element()).lstrip("+~"): _value_text(o) for o in _safe_overrides(config)}
        tags = {
            "sweep_dir": str(sweep_dir),
            "jobs": str(total or ""),
            "overrides": " ".join(config.hydra.overrides.task),
        }
        link = start_sweep(settings, experiment, f"sweep {experiment} {sweep_dir.name}", tags, spec)
    info: dict[str, Any] = {"pid": os.getpid(), "total_jobs": total, "started": time.time(), "experiment": experiment}
    # what every job shares (e.g. +experiment=...): a job's name is what is left, its own settings
    info["shared_keys"] = [o.get_key_element() for o in _safe_overrides(config) if not o.is_sweep_override()]
    info["tracking"] = asdict(link) if link else None
    (sweep_dir / SWEEP_FILE).write_text(json.dumps(info, indent=2) + "\n")
    from paged_bench.cli.progress import SweepBar

    _active = _Sweep(sweep_dir, total, experiment, link, SweepBar(sweep_dir, total, job_counts))
    _outcome = None
    atexit.register(_at_exit)


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
    """End the active sweep: summary, plots, parent run closed with ``status`` (default:
    FINISHED, or FAILED when a job failed). Returns (failed, jobs); None if no sweep was active."""
    global _active, _outcome
    sweep, _active = _active, None
    if sweep is None:
        return None
    if sweep.bar is not None:
        sweep.bar.close()
    failed, jobs, files, note = _summarize(sweep)
    final = status or ("FAILED" if failed else "FINISHED")
    if sweep.link is not None:
        from paged_bench.tracking.runs import finish_sweep

        tags = {"jobs": str(jobs), "failed_jobs": str(failed), "sweep_dir": str(sweep.sweep_dir)}
        if note:
            tags["mlflow.note.content"] = note
        finish_sweep(sweep.link, final, files, tags)
    _outcome = (failed, jobs)
    return _outcome


def _summarize(sweep: _Sweep) -> tuple[int, int, list[Path], str | None]:
    """Build and print the sweep's report; a report that cannot be built must not keep the
    parent run open, so its failure is printed and the sweep still closes."""
    from paged_bench.report.load import REPORT_DIR, find_runs

    runs = find_runs(sweep.sweep_dir)
    failed = sum(r.status != "finished" for r in runs)
    jobs = max(len(runs), sweep.total or 0)
    failed += jobs - len(runs)  # jobs that never ran (an interrupted sweep)
    try:
        from paged_bench.cli.catalog import experiment_description
        from paged_bench.report.build import build_report

        report = build_report(runs, sweep.sweep_dir / REPORT_DIR, title=sweep.experiment,
                              description=experiment_description(sweep.experiment))  # fmt: skip
    except Exception as e:  # noqa: BLE001  (the parent run must still be closed)
        print(f"warning: the sweep report could not be built: {type(e).__name__}: {e}", file=sys.stderr)
        return failed, jobs, [], None
    print(f"\nsweep {sweep.experiment}: {jobs} job(s), {failed} not finished -> {sweep.sweep_dir}")
    print(report.table)
    print(f"report: {report.out_dir / 'report.md'}")
    return failed, jobs, report.files, report.markdown


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
