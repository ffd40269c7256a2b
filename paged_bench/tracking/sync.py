"""``python -m paged_bench.tracking.sync PATH...``: upload the runs and sweeps on disk that the tracking
store is missing, and close sweep parent runs left RUNNING by a process that is gone.

For when the tracking server was down, a job ran where it could not reach it, or a sweep's
process was killed: everything a run measured is in its folder, so nothing is lost. PATH is
a run folder, a sweep folder, or any folder above them (``runs/``). A run is in the store when
a run tagged with its folder holds the tag that ends a complete upload; a broken upload is
replaced. A sweep's jobs become children of its parent run (created if the sweep started
without a store). What a process still running on this host will log itself is left alone,
said in one line: a run whose process runs, every job of a sweep whose process runs (a process
that took a dead one's pid later is told apart by its start time; one on another host cannot be
seen from here: its runs are uploaded, as before).

A run or sweep records the store it was meant for (``tracking_uri`` in ``run_info.json`` and
``sweep.json``); one that records none (written before runs did) is taken as meant for the
embedded store, ``./runs/mlflow.db`` here. With no store named, each goes to its own store. With
one named (``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``: a team's server), only the runs
meant for it go; the others are counted, and ``--include-other-stores`` uploads them there too.

Idempotent: a second call uploads nothing. A folder with no runs uploads nothing and says so
(exit 0), but a store named by ``--tracking-uri`` (or
``$MLFLOW_TRACKING_URI``) is opened all the same: one it cannot open fails as it would with runs.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paged_bench.tracking  # noqa: F401  (telemetry off before mlflow is imported)
from paged_bench.cli.sweep_folder import SWEEP_FILE, alive_here, job_info, sweep_info
from paged_bench.errors import PagedBenchError, one_line
from paged_bench.report.load import REPORT_DIR, RUN_INFO, TRACKING_URI_KEY, Run, RunFileError, find_runs, read_json
from paged_bench.tracking import store
from paged_bench.tracking.runs import (
    RUN_DIR_TAG,
    SWEEP_DIR_TAG,
    finish_sweep,
    is_complete,
    start_sweep,
    upload_run,
    uploaded,
    uploads_of,
)  # fmt: skip
from paged_bench.tracking.uploader import wait_for_helper


@dataclass
class Tally:
    uploaded: int = 0
    present: int = 0
    closed: int = 0
    replaced: int = 0
    running: int = 0  # left to the process still running them
    unreadable: list[str] = field(default_factory=list)  # runs left out: why, naming the file
    other_stores: Counter[str] = field(default_factory=Counter)  # store -> runs meant for it, not the one named
    unrecorded: int = 0  # of those, runs that record no store (taken as meant for the embedded one)

    def skip(self, meant: str | None, runs: int) -> None:
        self.other_stores[store.without_credentials(meant or store.default_uri())] += runs
        self.unrecorded += runs if meant is None else 0


@dataclass(frozen=True)
class Target:
    """The store named to sync into (``uri``; None: none was, each run goes to its own) and
    whether runs meant for other stores go there too (``--include-other-stores``)."""

    uri: str | None
    other_stores: bool = False

    def store_of(self, meant: str | None) -> str | None:
        """Where a run meant for ``meant`` (None: it records no store) is uploaded; None: nowhere."""
        if self.uri is None:
            return store.resolve_uri(meant)  # its own (recorded absolute), else the embedded store
        if self.other_stores or store.same_store(meant or store.default_uri(), self.uri):
            return self.uri
        return None


class Store:
    """One tracking store, with what it already holds, looked up once per experiment."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.client = store.client(uri)
        self._runs: dict[str, dict[str, Any]] = {}
        self._sweeps: dict[str, dict[str, Any]] = {}

    def experiment(self, name: str) -> str:
        return store.experiment_id(self.client, name, self.uri)

    def runs(self, exp: str) -> dict[str, Any]:
        if exp not in self._runs:
            self._runs[exp] = uploaded(self.client, exp, RUN_DIR_TAG)
        return self._runs[exp]

    def sweeps(self, exp: str) -> dict[str, Any]:
        if exp not in self._sweeps:
            self._sweeps[exp] = uploaded(self.client, exp, SWEEP_DIR_TAG)
        return self._sweeps[exp]

    def drop_broken(self, exp: str, run_dir: Path) -> int:
        """Delete earlier uploads of ``run_dir`` that did not complete; how many."""
        broken = [r for r in uploads_of(self.client, exp, run_dir) if not is_complete(r)]
        for r in broken:
            self.client.delete_run(r.info.run_id)
        return len(broken)


def _experiment_of(run: Run) -> str:
    return run.config.get("experiment_name") or "paged_bench"


def sync_run(st: Store, run: Run, tally: Tally, parent_run_id: str | None = None, exp: str | None = None) -> str | None:
    """Upload the run unless the store has it; a note when its process still runs it."""
    run_dir = run.path.resolve()
    record = job_info(run_dir)
    # its own process logs it: uploaded now, it would be logged twice (also once it has its
    # status: the process writes that, then draws its plots and uploads for seconds more)
    if alive_here(record):
        tally.running += 1
        return f"{run_dir}: left alone, its process (pid {record['pid']}) still runs it (sync it once that has ended)"
    exp = exp or st.experiment(_experiment_of(run))
    if str(run_dir) in st.runs(exp):
        tally.present += 1
        return None
    tally.replaced += st.drop_broken(exp, run_dir)
    settings = run.config.get("tracking") or {}
    try:
        st.runs(exp)[str(run_dir)] = upload_run(st.client, exp, run_dir, settings, parent_run_id)
    except RunFileError as e:  # found before anything was logged: the other runs still go
        tally.unreadable.append(str(e))
        return None
    tally.uploaded += 1
    return None


def _process_gone(info: dict[str, Any]) -> bool:
    """Whether the sweep's process has ended (known only on its own host, or if it said so)."""
    if info.get("ended"):
        return True
    return info.get("host") == socket.gethostname() and bool(info.get("pid")) and not alive_here(info)


def _final_status(runs: list[Run]) -> str:
    statuses = {r.status for r in runs}
    return "KILLED" if "interrupted" in statuses else "FAILED" if statuses - {"finished"} else "FINISHED"


def sync_sweep(st: Store, sweep_dir: Path, runs: list[Run], tally: Tally) -> list[str]:
    """Upload a sweep's missing jobs under its parent run; notes on what is left open."""
    info = sweep_info(sweep_dir)
    # ended or not, its process may be logging them still; one on another host is not seen from
    # here, and its jobs are uploaded as before
    if alive_here(info):
        tally.running += len(runs)
        return [f"{sweep_dir}: left alone, its sweep's process (pid {info['pid']}) still runs: its "
                f"{len(runs)} job(s) and its parent run are its own (sync it once that has ended)"]  # fmt: skip
    experiment = info.get("experiment") or (_experiment_of(runs[0]) if runs else "paged_bench")
    exp = st.experiment(experiment)
    parent = st.sweeps(exp).get(str(sweep_dir))
    if parent is None:
        tags = {**(info.get("tags") or {}), SWEEP_DIR_TAG: str(sweep_dir)}
        run_name = info.get("run_name") or f"sweep {experiment} {sweep_dir.name}"
        run_id = start_sweep(st.client, exp, run_name, tags, info.get("params") or {}, experiment)
        parent = st.client.get_run(run_id)
        st.sweeps(exp)[str(sweep_dir)] = parent
    notes = [n for n in (sync_run(st, run, tally, parent.info.run_id, exp) for run in runs) if n]
    if parent.info.status != "RUNNING":
        return notes
    if not _process_gone(info):  # its process on another host: it may run still
        pid = info.get("pid")
        return [*notes, f"{sweep_dir}: its parent run stays RUNNING, the sweep's process (pid {pid}) still runs"]
    status = info.get("status") or _final_status(runs)
    report = sweep_dir / REPORT_DIR
    files = sorted(report.iterdir()) if report.is_dir() else []
    failed = sum(r.status != "finished" for r in runs)
    jobs = max(len(runs), info.get("total_jobs") or 0)  # as the sweep counts them: those never started too
    finish_sweep(st.client, parent.info.run_id, status, files,
                 {"jobs": str(jobs), "failed_jobs": str(failed), "jobs_not_run": str(jobs - len(runs))})  # fmt: skip
    tally.closed += 1
    return notes


def _groups(paths: Iterable[Path], unreadable: list[RunFileError]) -> tuple[dict[Path, list[Run]], list[Run]]:
    """Sweeps (their folder -> jobs) and single runs under ``paths``; runs whose files cannot be
    read go to ``unreadable`` instead."""
    sweeps: dict[Path, list[Run]] = {}
    singles: list[Run] = []
    for path in paths:
        for run in find_runs(path, unreadable=unreadable):
            folder = run.path.resolve().parent
            if (folder / SWEEP_FILE).is_file():
                sweeps.setdefault(folder, []).append(run)
            elif not read_json(run.path / RUN_INFO).get("refused"):  # a refused command ran nothing, logged nothing
                singles.append(run)
        for sweep_file in Path(path).glob(f"**/{SWEEP_FILE}"):  # a sweep none of whose jobs started
            sweeps.setdefault(sweep_file.parent.resolve(), [])
    return sweeps, singles


def sync(paths: list[Path], tracking_uri: str | None = None, other_stores: bool = False) -> tuple[Tally, list[str]]:
    wait_for_helper()  # what a killed command handed over is being logged right now
    unreadable: list[RunFileError] = []
    sweeps, singles = _groups(paths, unreadable)
    named = tracking_uri or os.environ.get(store.URI_ENV)
    target = Target(store.resolve_uri(named) if named else None, other_stores)
    stores: dict[str, Store] = {}

    def store_for(uri: str) -> Store:
        if uri not in stores:
            stores[uri] = Store(uri)
        return stores[uri]

    tally, notes = Tally(unreadable=[str(e) for e in unreadable]), []
    if not (sweeps or singles or unreadable) and target.uri:
        store_for(target.uri)  # nothing to upload, but a store named that cannot be opened fails as with runs
    for sweep_dir, runs in sorted(sweeps.items()):
        info = sweep_info(sweep_dir)
        link = (info.get("tracking") or {}).get("uri")  # the parent run's store (an older sweep records only it)
        meant = info.get(TRACKING_URI_KEY) or link
        uri = target.store_of(meant)
        if uri is None:
            tally.skip(meant, len(runs))
            continue
        # the link's URI, not the record's: the one the sweep opened, credentials and all
        notes += sync_sweep(store_for(link if uri == meant and link else uri), sweep_dir, runs, tally)
    for run in singles:
        meant = read_json(run.path / RUN_INFO).get(TRACKING_URI_KEY)
        uri = target.store_of(meant)
        if uri is None:
            tally.skip(meant, 1)
        elif (note := sync_run(store_for(uri), run, tally)) is not None:
            notes.append(note)
    if tally.other_stores:
        notes.append(_skipped_note(tally, str(target.uri)))
    return tally, notes


def _skipped_note(tally: Tally, target: str) -> str:
    """What was left out for being meant for another store, and how to upload it all the same."""
    stores = [f"{n} for {uri}" for uri, n in tally.other_stores.most_common(3)]
    more = len(tally.other_stores) - len(stores)
    unrecorded = (f"; {tally.unrecorded} of these written before runs recorded their store: taken as meant for "
                  "the embedded one" if tally.unrecorded else "")  # fmt: skip
    return (f"{sum(tally.other_stores.values())} run(s) meant for other stores not uploaded to "
            f"{store.without_credentials(target)} ({', '.join(stores)}{f', {more} more store(s)' if more else ''}"
            f"{unrecorded}): add --include-other-stores to upload them there too, or leave the store unnamed to "
            "upload each to its own")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paged_bench.tracking.sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep folders, or folders above them (runs/)")
    parser.add_argument("--tracking-uri", help="the store to upload to (default: $MLFLOW_TRACKING_URI, else each run's "
                                               "own: the one its folder records, else ./runs/mlflow.db); only the "
                                               "runs meant for it go")  # fmt: skip
    parser.add_argument("--include-other-stores", action="store_true",
                        help="with a store named, upload to it the runs meant for other stores too (by default "
                             "they are counted and left out; a run that records no store is meant for ./runs/mlflow.db)")  # fmt: skip
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        print(f"error: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    files = [str(p) for p in args.paths if not p.is_dir()]  # a file holds no runs: "0 uploaded" hid the typo
    if files:
        print(f"error: not a folder: {', '.join(files)} (give run or sweep folders, or a folder above them)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        store.check_uri(args.tracking_uri, "--tracking-uri")
    except PagedBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    try:
        tally, notes = sync(args.paths, args.tracking_uri, args.include_other_stores)
    except Exception as e:  # noqa: BLE001  (one line: the store is unreachable or refused)
        print(f"error: sync failed: {one_line(e)}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for why in tally.unreadable:
        print(f"error: not uploaded: {why}", file=sys.stderr)
    print(f"sync: {tally.uploaded} run(s) uploaded, {tally.present} already in the store, "
          f"{tally.closed} sweep parent run(s) closed" + (f", {tally.replaced} broken upload(s) replaced" if tally.replaced else "")
          + (f", {tally.running} still running left alone" if tally.running else "")
          + (f", {sum(tally.other_stores.values())} meant for other stores skipped" if tally.other_stores else "")
          + (f", {len(tally.unreadable)} unreadable run(s) left out" if tally.unreadable else ""))  # fmt: skip
    return 1 if tally.unreadable else 0


if __name__ == "__main__":
    sys.exit(main())
