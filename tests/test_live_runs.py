"""Folders a live process still holds: ``sync`` leaves a run or a sweep that is still running
on this host alone (its own process logs it; uploaded, it would be logged twice), the upload a
run's own process asks for skips a run ``sync`` uploaded whole meanwhile (but not a rerun into
its folder), and a sweep started into a folder that a running sweep uses is refused in one line,
touching nothing (one whose process is gone is reused as before)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import socket
import subprocess
import threading
import time

import pytest

from paged_bench.cli import sweep, sweep_folder
from paged_bench.cli.track import track_job
from paged_bench.run.tracking_settings import TrackingSettings
from paged_bench.tracking import store, uploader
from tests.tracking_support import call_cli, fresh_store, in_a_child, runs_of, sweep_config

SMALL = ["workload.num_requests=20"]
UNTRACKED = [*SMALL, "tracking.enabled=false"]


def _sync(cwd, *paths):
    return call_cli(cwd, *map(str, paths), module="paged_bench.tracking.sync")


def _dead_pid() -> int:
    """A pid no process has now: a child's, once it has ended and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture
def live_pid():
    """A process of this host, other than the test's (and ``sync``'s), alive for the test."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _set_record(path, **fields) -> None:
    record = json.loads(path.read_text())
    record.update(fields)
    path.write_text(json.dumps({k: v for k, v in record.items() if v is not None}))


def test_sync_leaves_a_run_still_running_alone_until_it_has_ended(tmp_path, live_pid):
    uri = fresh_store(tmp_path)
    running, ending, reused = (tmp_path / "runs" / name for name in ("running", "ending", "reused"))
    assert call_cli(tmp_path, *UNTRACKED, f"hydra.run.dir={running}").returncode == 0
    shutil.copytree(running, ending)
    shutil.copytree(running, reused)
    host = socket.gethostname()
    _set_record(running / "run_info.json", pid=live_pid, host=host, status=None)  # in its engine loop
    # its status written, its plots and its own upload still to come: logged twice before
    _set_record(ending / "run_info.json", pid=live_pid, host=host, status="finished")
    # a process that took the pid of a run that ended an hour ago is not that run's
    _set_record(reused / "run_info.json", pid=live_pid, host=host, start_time=time.time() - 3600)

    first = _sync(tmp_path, tmp_path / "runs")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == ("sync: 1 run(s) uploaded, 0 already in the store, 0 sweep parent run(s) "
                                    "closed, 2 still running left alone")  # fmt: skip
    assert f"note: {running}: left alone, its process (pid {live_pid}) still runs it" in first.stderr
    _, runs = runs_of(uri, "paged_bench")
    assert [r.data.tags["run_dir"] for r in runs] == [str(reused)]

    _set_record(running / "run_info.json", pid=_dead_pid())  # killed outright: it logs nothing itself
    second = _sync(tmp_path, tmp_path / "runs")
    assert second.stdout.strip() == ("sync: 1 run(s) uploaded, 1 already in the store, 0 sweep parent run(s) "
                                     "closed, 1 still running left alone")  # fmt: skip
    _, runs = runs_of(uri, "paged_bench")
    assert sorted(r.data.tags["run_dir"] for r in runs) == sorted([str(reused), str(running)])


def test_sync_leaves_the_jobs_of_a_sweep_still_running_alone(tmp_path, live_pid):
    uri = fresh_store(tmp_path)
    sweep_dir = tmp_path / "runs" / "sw"
    assert call_cli(tmp_path, "-m", "max_batch=2,4", *UNTRACKED, f"hydra.sweep.dir={sweep_dir}").returncode == 0
    info = sweep_folder.sweep_info(sweep_dir)
    sweep_folder.write_info(sweep_dir, {**info, "pid": live_pid})  # ended, yet still logging its jobs

    first = _sync(tmp_path, tmp_path / "runs")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == ("sync: 0 run(s) uploaded, 0 already in the store, 0 sweep parent run(s) "
                                    "closed, 2 still running left alone")  # fmt: skip
    assert first.stderr.strip() == (f"note: {sweep_dir}: left alone, its sweep's process (pid {live_pid}) still "
                                    "runs: its 2 job(s) and its parent run are its own (sync it once that has ended)")
    assert not _has_experiment(uri) or runs_of(uri, "paged_bench")[1] == []  # nor a parent run

    sweep_folder.write_info(sweep_dir, {**info, "pid": _dead_pid()})
    second = _sync(tmp_path, tmp_path / "runs")
    assert second.stdout.strip() == "sync: 2 run(s) uploaded, 0 already in the store, 1 sweep parent run(s) closed"


def _has_experiment(uri: str) -> bool:
    from tests.tracking_support import client

    return client(uri).get_experiment_by_name("paged_bench") is not None


def _log_as_the_run_ends(run_dir, uri: str) -> None:
    """What a run's own process does as it ends (``track_job``): hand its folder to the tracking
    helper, and wait for it."""
    store.reset_failure()
    track_job(TrackingSettings(uri=uri), run_dir, None)
    uploader.close_shared()
    assert store.failure() is None


def test_a_run_uploaded_whole_is_not_uploaded_again_but_a_rerun_into_its_folder_is(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGED_BENCH_TRACKING_IDLE_S", "20")  # the helper this starts goes soon after the tests
    uri = fresh_store(tmp_path)
    run_dir = tmp_path / "runs" / "r1"
    assert call_cli(tmp_path, *UNTRACKED, f"hydra.run.dir={run_dir}").returncode == 0
    assert _sync(tmp_path, run_dir).returncode == 0  # as the run ended: then its own process asks
    (synced,) = runs_of(uri, "paged_bench")[1]
    _log_as_the_run_ends(run_dir, uri)
    assert [r.info.run_id for r in runs_of(uri, "paged_bench")[1]] == [synced.info.run_id]

    _set_record(run_dir / "run_info.json", start_time=time.time())  # another run in the same folder
    _log_as_the_run_ends(run_dir, uri)
    assert len(runs_of(uri, "paged_bench")[1]) == 2


def _files(folder) -> dict[str, tuple[bytes, int]]:
    files = (p for p in folder.rglob("*") if p.is_file())
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in files}


def test_a_sweep_into_a_folder_a_running_sweep_uses_is_refused_touching_nothing(tmp_path, live_pid):
    sweep_dir = tmp_path / "runs" / "sw"
    assert call_cli(tmp_path, "-m", "max_batch=2", *UNTRACKED, f"hydra.sweep.dir={sweep_dir}").returncode == 0
    info = sweep_folder.sweep_info(sweep_dir)
    sweep_folder.write_info(sweep_dir, {**info, "pid": live_pid})
    before = _files(sweep_dir)

    proc = call_cli(tmp_path, "-m", "max_batch=8", *UNTRACKED, f"hydra.sweep.dir={sweep_dir}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {sweep_dir} is in use by a running sweep (pid {live_pid}): "
                                                "use another hydra.sweep.dir, or wait for it"]  # fmt: skip
    assert _files(sweep_dir) == before

    sweep_folder.write_info(sweep_dir, {**info, "pid": _dead_pid()})  # that sweep was killed: reused, as before
    again = call_cli(tmp_path, "-m", "max_batch=8", *UNTRACKED, f"hydra.sweep.dir={sweep_dir}")
    assert again.returncode == 0, again.stderr
    new_id = sweep_folder.sweep_info(sweep_dir)["id"]
    jobs = sweep_folder.job_dirs(sweep_dir)
    assert new_id != info["id"] and [sweep_folder.job_info(d)["sweep_id"] for d in jobs] == [new_id]


def test_of_two_sweeps_claiming_a_folder_at_once_the_second_is_refused(tmp_path, live_pid):
    """The folder is checked and claimed under its lock: a sweep that waited for it sees the
    first one's record, written meanwhile."""
    config = sweep_config(tmp_path, "max_batch=2")
    take_lock = sweep_folder.locked

    def scenario() -> None:  # in a child: a sweep that starts keeps its state in its process
        at_lock, refused = threading.Event(), []

        @contextlib.contextmanager
        def announced(sweep_dir):
            at_lock.set()
            with take_lock(sweep_dir):
                yield

        def second() -> None:
            try:
                sweep.start(config)
            except SystemExit as e:
                refused.append(e.code)

        sweep_folder.locked = announced
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            with take_lock(tmp_path):
                waiting = threading.Thread(target=second)
                waiting.start()
                assert at_lock.wait(30)
                time.sleep(0.2)
                assert waiting.is_alive()  # it waits for the lock
                sweep_folder.write_info(tmp_path, {"pid": live_pid, "host": socket.gethostname()})  # the first's
            waiting.join(10)
        assert refused == [2]
        assert f"is in use by a running sweep (pid {live_pid})" in err.getvalue()

    in_a_child(scenario)


def test_a_folder_of_a_sweep_that_is_gone_or_on_another_host_is_claimed(tmp_path):
    config = sweep_config(tmp_path, "max_batch=2")
    for holder in ({"pid": _dead_pid(), "host": socket.gethostname()}, {"pid": 1, "host": "another-node"}):
        sweep_folder.write_info(tmp_path, {"id": "earlier", **holder})
        (tmp_path / "report").mkdir()  # the earlier sweep's: must not pass for this one's
        in_a_child(lambda: (sweep.start(config), sweep.finish()))  # (a sweep's state stays in the child)
        info = sweep_folder.sweep_info(tmp_path)
        assert info["id"] != "earlier" and info["host"] == socket.gethostname() and info["pid"] != holder["pid"]
        assert not (tmp_path / "report").exists()


def test_a_run_into_a_folder_a_running_job_uses_is_refused_touching_nothing(tmp_path, live_pid):
    # clear_results deleted the live run's files, then both wrote into one folder
    run_dir = tmp_path / "runs" / "one"
    assert call_cli(tmp_path, *UNTRACKED, f"hydra.run.dir={run_dir}").returncode == 0
    _set_record(run_dir / "run_info.json", pid=live_pid, host=socket.gethostname(), status=None)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    proc = call_cli(tmp_path, *UNTRACKED, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: {run_dir} is in use by a running job (pid {live_pid}): use another hydra.run.dir, or wait for it")
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    _set_record(run_dir / "run_info.json", pid=_dead_pid())  # its process is gone: the folder is reused
    assert call_cli(tmp_path, *UNTRACKED, f"hydra.run.dir={run_dir}").returncode == 0
