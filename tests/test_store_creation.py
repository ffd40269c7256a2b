"""A new embedded store is made whole or not at all: processes that open it at once (two first
runs, a run and ``sync``, a run and ``make ui``) or one killed while it is made never leave a
half-migrated ``runs/mlflow.db`` that no later run or sync can open."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from paged_bench.tracking import store

# four processes open the new store and log a run at once: forked from one interpreter that
# imported MLflow first (importing it is ~3 CPU-s a process; the race is in making the store)
OPEN_AND_LOG = """
import os, sys, traceback
from pathlib import Path
import mlflow.store.tracking.sqlalchemy_store
from paged_bench.tracking import store
uri = f"sqlite:///{Path(sys.argv[1]).resolve()}"
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            client = store.client(uri)
            exp = store.experiment_id(client, "race", uri)
            client.create_run(exp)
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(status)
    children.append(pid)
failed = [pid for pid in children if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
sys.exit(f"{len(failed)} of 4 processes failed" if failed else 0)
"""


def _tables(path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_processes_that_create_the_store_at_once_all_log_into_one_whole_store(tmp_path):
    # MLflow migrates a new file in place: 2 of 4 such races left "table _alembic_tmp_metrics
    # already exists" for every later run
    path = tmp_path / "runs" / "mlflow.db"
    proc = subprocess.run([sys.executable, "-c", OPEN_AND_LOG, str(path)], capture_output=True, text=True,
                          timeout=180, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    tables = _tables(path)
    assert {"experiments", "runs", "alembic_version"} <= tables
    assert not [t for t in tables if t.startswith("_alembic_tmp")]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 4
    assert not list(path.parent.glob(".mlflow.db.*.tmp*"))


def test_a_creator_stopped_midway_leaves_no_store_and_the_next_one_makes_it_whole(tmp_path, monkeypatch):
    path = tmp_path / "mlflow.db"
    real = os.replace

    def stopped(src, dst, **kwargs):  # the tables are made; the process is stopped before the file is in place
        if Path(dst) == path:
            raise KeyboardInterrupt
        return real(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        store.prepare_sqlite(path)
    assert not path.exists() and not list(tmp_path.glob(".mlflow.db.*.tmp*"))
    monkeypatch.setattr(os, "replace", real)
    store.prepare_sqlite(path)
    assert {"experiments", "runs"} <= _tables(path)


def test_a_stale_temporary_file_of_a_killed_creator_is_removed(tmp_path):
    path = tmp_path / "mlflow.db"
    (tmp_path / ".mlflow.db.99999.tmp").write_bytes(b"half a store")  # its creator was SIGKILLed
    store.prepare_sqlite(path)
    assert {"experiments", "runs"} <= _tables(path) and not list(tmp_path.glob(".mlflow.db.*.tmp*"))


def test_a_second_creator_waits_for_the_first_and_then_opens_its_store(tmp_path):
    path = tmp_path / "mlflow.db"
    with open(tmp_path / ".mlflow.db.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process is making the store
        waiter = threading.Thread(target=store.prepare_sqlite, args=(path,))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not path.exists()
        made = tmp_path / "other" / "mlflow.db"  # the other process finishes: its store is moved into place
        store.prepare_sqlite(made)
        os.replace(made, path)
        created = path.stat().st_ino
    waiter.join(60)
    assert not waiter.is_alive() and path.stat().st_ino == created  # opened, not made again
