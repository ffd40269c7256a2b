"""Progress bars (tqdm, on stderr) for runs and sweeps that take more than a couple of seconds.

A run's bar counts finished requests and shows the current output throughput (tokens per
second on the run's clock: virtual time for the sim); a sweep's bar counts finished jobs by
watching the sweep folder, so it works whichever launcher runs the jobs (in-process, joblib
workers). Both stay hidden for the first ``DELAY_S`` seconds, so short runs print no bar,
and when stderr is not a terminal (logs, CI) unless ``disable=False`` asks for them.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from paged_bench.run.outcome import Progress

DELAY_S = 2.0


class JobBar:
    """``on_progress`` for ``app.run_job``: requests finished / total and output tok/s."""

    def __init__(self, enabled: bool = True, *, nested: bool = False, file: TextIO | None = None,
                 delay: float = DELAY_S, disable: bool | None = None):  # fmt: skip
        self._bar = None
        self._kw = {
            "desc": "requests", "unit": "req", "file": file or sys.stderr, "delay": delay, "leave": not nested,
            "position": 1 if nested else 0, "dynamic_ncols": True, "mininterval": 0.25, "disable": disable,
        }  # fmt: skip
        self.enabled = enabled

    @property
    def shown(self) -> bool:
        """Whether a bar can appear at all; when not, a run is given no progress callback (no
        per-step work for nobody)."""
        disable = self._kw["disable"]
        if not self.enabled or disable:
            return False
        # tqdm's rule for disable=None: a bar only on a terminal
        return disable is False or bool(getattr(self._kw["file"], "isatty", lambda: False)())

    def __call__(self, progress: Progress) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=progress.total, **self._kw)
        self._bar.n = progress.finished
        rate = progress.output_tokens / progress.now if progress.now > 0 else 0.0
        self._bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)
        self._bar.update(0)  # redraws at most every mininterval, and only after the delay

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class SweepBar:
    """Jobs finished / total of a sweep, counted from the job folders' ``run_info.json``."""

    def __init__(self, sweep_dir: Path, total: int | None, count: Callable[[Path], tuple[int, int]],
                 *, file: TextIO | None = None, delay: float = DELAY_S, interval: float = 0.5,
                 disable: bool | None = None):  # fmt: skip
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc="sweep", unit="job", file=file or sys.stderr, delay=delay, position=0,
                         dynamic_ncols=True, disable=disable)  # fmt: skip
        self._dir, self._count, self._interval = sweep_dir, count, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sweep-progress", daemon=True)
        if not self._bar.disable:
            self._thread.start()

    def _poll(self) -> None:
        done, failed = self._count(self._dir)
        self._bar.n = done
        self._bar.set_postfix_str(f"{failed} failed" if failed else "", refresh=False)
        self._bar.update(0)

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            self._poll()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._poll()
        self._bar.close()


def echo(line: str) -> None:
    """Print a line without tearing a progress bar that is showing."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
