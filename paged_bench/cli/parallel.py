"""How many of a sweep's jobs run side by side, and whether their wall-clock timings would
fight over the cores.

A sweep whose launcher runs jobs in parallel on this machine (``joblib``, ``submitit_local``,
a local Ray) tells its jobs how many run at once (``threads.PARALLEL_JOBS_ENV``), so that a
real model takes its share of the cores instead of one thread per core each. A sweep that
would put more wall-clock threads on the cores than there are cores is refused before any job
runs: its timings would measure the jobs' contention, not the engines. joblib's workers note a
signal that lands while they wait for a job instead of dying of it (``signals.note_between_jobs``).
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

from paged_bench.cli import signals
from paged_bench.errors import ConfigError, PagedBenchError
from paged_bench.run import registry
from paged_bench.run.threads import PARALLEL_JOBS_ENV, cpu_count


def side_by_side(config: DictConfig, total: int | None) -> tuple[int, str | None]:
    """(how many jobs run at once on this machine, the knob that says so)."""
    target = str(OmegaConf.select(config, "hydra.launcher._target_") or "")
    cpus = cpu_count()
    if target.endswith("JoblibLauncher"):
        n = int(OmegaConf.select(config, "hydra.launcher.n_jobs") or 1)
        n, knob = (n if n > 0 else max(1, cpus + 1 + n)), "hydra.launcher.n_jobs"  # joblib: -1 = every core
    elif target.endswith("RayLauncher") and OmegaConf.select(config, "hydra.launcher.ray.init.address") is None:
        n, knob = int(OmegaConf.select(config, "hydra.launcher.ray.init.num_cpus") or cpus), "hydra.launcher.ray.init.num_cpus"
    elif target.endswith("submitit_launcher.LocalLauncher"):
        n, knob = total or 1, "hydra/launcher"  # submitit's local executor starts every job at once
    else:
        return 1, None  # one at a time here, or each job on its own machine
    return max(1, min(n, total or n)), knob


def _job_backends(config: DictConfig, jobs: list[list[str]]) -> list[tuple[str, Any]]:
    """Each job's backend option and its ``backend.threads`` (None: the job's CPU share)."""
    base = str(OmegaConf.select(config, "hydra.runtime.choices.backend") or "sim")
    base_threads = OmegaConf.select(config, "backend.threads")
    out = []
    for overrides in jobs or [[]]:
        given = dict(o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)
        backend = given.get("backend", base)
        threads = given.get("backend.threads", base_threads if backend == base else None)
        out.append((backend, None if threads in (None, "null") else int(threads)))
    return out


def _wall_clock(backend: str, config: DictConfig) -> bool:
    if OmegaConf.select(config, "clock") == "wall":
        return True
    try:
        return registry.load("backend", backend).clock == "wall"
    except PagedBenchError:  # an option named unlike its plugin: the job will tell
        return False


def _joblib_workers_note_signals() -> None:
    """joblib's worker processes (loky) start by installing ``signals.note_between_jobs``. A
    Ctrl-C that finds one idle (more workers than jobs left) would otherwise end it in its wait
    for a job, and loky, its pool broken, would SIGKILL the workers whose jobs are writing
    what they measured."""
    from joblib import register_parallel_backend
    from joblib._parallel_backends import LokyBackend

    class NotingLokyBackend(LokyBackend):
        def configure(self, *args: Any, **kwargs: Any) -> int:
            kwargs.setdefault("initializer", signals.note_between_jobs)
            return super().configure(*args, **kwargs)

    register_parallel_backend("loky", NotingLokyBackend)


def prepare(config: DictConfig, jobs: list[list[str]], total: int | None) -> None:
    """Tell the jobs how many run at once; refuse a sweep that oversubscribes the cores."""
    if str(OmegaConf.select(config, "hydra.launcher._target_") or "").endswith("JoblibLauncher"):
        _joblib_workers_note_signals()
    parallel, knob = side_by_side(config, total)
    os.environ[PARALLEL_JOBS_ENV] = str(parallel)
    if parallel <= 1:
        return
    cpus = cpu_count()
    for backend, threads in _job_backends(config, jobs):
        if not _wall_clock(backend, config):
            continue
        each = threads or max(1, cpus // parallel)
        if parallel * each > cpus:
            raise ConfigError(knob or "hydra/launcher", parallel,
                              f"at most {max(1, cpus // each)} wall-clock jobs side by side on {cpus} cores "
                              f"(backend={backend}, {each} thread(s) each): their timings would measure each "
                              "other; lower it, or backend.threads, or use backend=sim")  # fmt: skip
