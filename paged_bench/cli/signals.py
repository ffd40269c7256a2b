"""SIGTERM and SIGHUP (``timeout``, a SLURM time limit, a closed terminal) end a job the way
Ctrl-C does: the engine stops, what it measured is written and logged as KILLED, a sweep's
parent run is closed and its report written; the command then exits with the signal's status
(128 + its number).

The handler raises ``Terminated``, a KeyboardInterrupt, so every path that handles Ctrl-C
handles these too; a second signal while that clean-up runs is ignored, so the clean-up
finishes. A sweep's process first passes the signal on to the processes running its jobs on
this host (the joblib workers, which may not have got it: ``kill PID`` reaches one process)
and waits a little for the jobs that started to record how they ended, before the launcher
kills them. A launcher's worker process notes a signal that lands between its jobs instead
of raising it (see ``note_between_jobs``), and starts no job after one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator

HANDLED = (signal.SIGTERM, signal.SIGHUP)
WITH_CTRL_C = (signal.SIGINT, *HANDLED)  # inside a job and a sweep: a second Ctrl-C waits for the clean-up
GRACE_S = 10.0  # how long a sweep waits for its jobs in other processes to record their end


class Terminated(KeyboardInterrupt):
    """The process was asked to stop by ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    def __reduce__(self) -> tuple[type, tuple[int]]:
        # a joblib worker sends its job's exception back pickled; rebuilt from its args
        # ("SIGINT"), __init__ would fail in the sweep's process, and loky would then call its
        # pool broken and SIGKILL every worker, jobs still writing what they measured included
        return type(self), (self.signum,)


_received: int | None = None
_deferred = False  # while a sweep opens or closes, or a job writes its figures: a signal is noted, not raised


def received() -> int | None:
    """The signal that asked this process to stop, if one did."""
    return _received


@contextlib.contextmanager
def deferred(raise_after: bool = False) -> Iterator[None]:
    """Inside, a signal does not interrupt (opening or closing a sweep, writing what a job
    measured, must not be cut short); with ``raise_after`` it is raised when the block is
    done, else the caller acts on ``received()`` afterwards."""
    global _deferred
    before, _deferred = _received, True
    try:
        yield
    finally:
        _deferred = False
    if raise_after and _received is not None and before is None:
        raise Terminated(_received)


def install(signums: tuple[int, ...], on_stop: Callable[[int], None] | None = None) -> None:
    """For the rest of the process (main thread only): ``signums`` raise ``Terminated``."""
    with contextlib.suppress(ValueError):
        for s in signums:
            signal.signal(s, _handler(on_stop))


def note_between_jobs(signums: tuple[int, ...] = WITH_CTRL_C) -> None:
    """In a launcher's worker process, for the rest of its life: a signal that lands between
    jobs (``stop_on_signals`` raises it inside one) is noted, not raised. Raised in loky's
    wait for its next job, the worker would exit, and loky would call the pool broken and
    SIGKILL every other worker, jobs still recording what they measured included; noted, it
    keeps the worker from starting another job (``received``)."""
    with contextlib.suppress(ValueError):
        for s in signums:
            signal.signal(s, _note)


def _note(signum: int, frame: object) -> None:
    global _received
    if _received is None:
        _received = signum


def exit_status(default: int = signal.SIGINT) -> int:
    """128 + the signal that stopped the command (SIGINT's 130 for Ctrl-C)."""
    return 128 + (_received or default)


def stopped_by() -> str:
    return "interrupted" if _received in (None, signal.SIGINT) else f"stopped by {signal.Signals(_received).name}"


def _handler(on_stop: Callable[[int], None] | None) -> Callable:
    def handle(signum: int, frame: object) -> None:
        global _received
        if _received is not None:
            return  # already stopping: let the clean-up finish
        _received = signum
        if _deferred:
            return
        if on_stop is not None:
            on_stop(signum)
        raise Terminated(signum)

    return handle


@contextlib.contextmanager
def stop_on_signals(signums: tuple[int, ...] = HANDLED, on_stop: Callable[[int], None] | None = None) -> Iterator[None]:
    """While inside, ``signums`` raise ``Terminated`` (in the main thread only); one noted
    before (between a worker's jobs, as this job started) is raised on entry."""
    try:
        previous = {s: signal.signal(s, _handler(on_stop)) for s in signums}
    except ValueError:  # not the main thread: the launcher's own process handles signals
        yield
        return
    try:
        if _received is not None:
            raise Terminated(_received)
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def pass_on(signum: int, job_pids: list[int], wait_for: Callable[[], bool]) -> None:
    """Send ``signum`` to the processes running the sweep's jobs on this host (a process that
    got it already, from the terminal's Ctrl-C, ignores it: ``_handler``, ``_note``) and wait
    up to ``GRACE_S`` until ``wait_for()`` says the jobs recorded their end."""
    for pid in job_pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)
    deadline = time.monotonic() + (GRACE_S if job_pids else 0)
    while time.monotonic() < deadline and not wait_for():
        time.sleep(0.1)
