"""How many CPU threads a wall-clock backend uses: ``backend.threads``, else the job's share
of the cores.

A real model's timings are the point of a wall-clock run, and they collapse when threads
outnumber cores: torch's default (one thread per core in every process) under two parallel
jobs made an engine run fall to 2 tok/s where it ran at 16 alone. A sweep that runs jobs side
by side says how many (``PARALLEL_JOBS_ENV``, set by ``cli.sweep`` for the launcher's
workers); each job then takes ``cores // parallel jobs`` threads unless told otherwise.
"""

from __future__ import annotations

import os

from paged_bench.errors import check_int

PARALLEL_JOBS_ENV = "PAGED_BENCH_PARALLEL_JOBS"


def cpu_count() -> int:
    """The cores this process may run on (its affinity, e.g. a SLURM allocation)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parallel_jobs() -> int:
    try:
        return max(1, int(os.environ.get(PARALLEL_JOBS_ENV, "1")))
    except ValueError:
        return 1


def cpu_share() -> int:
    """This job's share of the cores: at least one thread."""
    return max(1, cpu_count() // parallel_jobs())


MAX_THREADS = 1024  # far past any core count here; 30,000 made libgomp fail and 100,000 crashed torch


def job_threads(key: str, threads: int | None) -> int:
    """``threads`` if given (an integer from 1 to ``MAX_THREADS``), else the job's CPU share."""
    return cpu_share() if threads is None else check_int(key, threads, 1, MAX_THREADS)


def pin_torch_threads(threads: int) -> int:
    """Set torch's CPU threads for the process; returns the previous count (to restore)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    return previous
