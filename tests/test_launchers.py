"""Sweeps through Hydra's distributed launchers (installed with the ``slurm`` and ``ray``
extras): ``submitit_local`` (submitit's local executor: each job its own process, as on a
SLURM node), ``ray_local`` (a small Ray instance started for the sweep), and ``ray`` attached
to an existing Ray cluster (the documented recipe). Each sweep must end as one MLflow parent
run with a child per job, whichever process ran the job. The capacity planner's simulations go
through the same launchers (``python -m paged_bench.plan hydra/launcher=submitit_local``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.tracking_support import call_cli, cli_env, free_port, fresh_store, run_cli, runs_of


def _assert_one_parent_two_children(uri: str) -> None:
    _, runs = runs_of(uri, "paged_bench")
    (parent,) = [r for r in runs if r.data.tags.get("paged_bench.kind") == "sweep"]
    children = sorted((r for r in runs if r is not parent), key=lambda r: int(r.data.tags["job_num"]))
    assert parent.info.status == "FINISHED" and parent.data.tags["jobs"] == "2"
    assert [(r.info.run_name, r.info.status) for r in children] == [("max_batch=4", "FINISHED"),
                                                                      ("max_batch=8", "FINISHED")]  # fmt: skip
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    assert all(r.data.metrics["completed"] == 48 for r in children)


@pytest.mark.slow
@pytest.mark.parametrize("launcher, trace", [("submitit_local", ".submitit"), ("ray_local", "Started a local Ray")])
def test_a_two_job_sweep_through_a_distributed_launcher(tmp_path, launcher, trace):
    pytest.importorskip({"submitit_local": "hydra_plugins.hydra_submitit_launcher",
                         "ray_local": "hydra_plugins.hydra_ray_launcher"}[launcher])  # fmt: skip
    uri = fresh_store(tmp_path)
    proc = run_cli(tmp_path, "-m", f"hydra/launcher={launcher}", "max_batch=4,8", timeout=300)
    assert proc.returncode == 0, proc.stderr
    # it really was that launcher: submitit's job folders, Ray's start-up line
    assert trace in proc.stderr or list(tmp_path.glob(f"runs/multirun/*/*/{trace}"))
    _assert_one_parent_two_children(uri)


@pytest.mark.slow
def test_a_sweep_attaches_to_an_existing_ray_cluster(tmp_path):
    """hydra/launcher=ray with the cluster's address and no object store size (the cluster
    has one, and Ray refuses one from a client that connects)."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    port = free_port()
    env = cli_env(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")  # a loopback cluster of this test only
    # --block: the head's processes stay in the session of this one (ray stop --force would kill
    # every Ray process on the machine, a concurrent suite's too); they go with it. Its own temp
    # dir (short: Ray's socket paths): its address file is not /tmp/ray's, where ray.init()
    # (ray_local's) looks for a cluster to join
    log, temp_dir = tmp_path / "ray_start.log", tempfile.mkdtemp(prefix="ray-")
    with log.open("w") as out:  # the head writes to its own copy
        head = subprocess.Popen([sys.executable, "-c", "from ray.scripts.scripts import main; main()", "start",
                                 "--head", "--block", f"--temp-dir={temp_dir}", "--node-ip-address=127.0.0.1",
                                 f"--port={port}", "--num-cpus=2", "--object-store-memory=100000000",
                                 "--include-dashboard=false", "--disable-usage-stats",
                                 "--include-log-monitor=false"],  # (a process the jobs' results do not go through)
                                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while "will now block" not in log.read_text() and head.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert head.poll() is None and "will now block" in log.read_text(), log.read_text()[-3000:]
        uri = fresh_store(tmp_path)
        proc = run_cli(tmp_path, "-m", "hydra/launcher=ray", f"hydra.launcher.ray.init.address=127.0.0.1:{port}",
                       "+hydra.launcher.ray.init.object_store_memory=null", "+hydra.launcher.ray.remote.num_cpus=1",
                       "max_batch=4,8", timeout=300, RAY_AUTH_MODE="disabled")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "Connected to Ray cluster" in proc.stderr
        _assert_one_parent_two_children(uri)
    finally:
        _kill_session(head.pid)  # the head, its GCS, raylet, agents and workers (each worker a group of its own)
        head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (from /proc), until none is left."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid and fields[0] != "Z":  # state, ppid, pgrp, session
                    alive.append(int(stat.parent.name))
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


@pytest.mark.slow
def test_a_plans_simulations_run_as_submitit_jobs(tmp_path):
    """Each wave of a plan's simulations is one launch of the configured launcher: with
    submitit_local every simulation is a job in its own process (its folder under the trials'
    .submitit), and the plan still finds its answer (one H100 serves 6x; one A100 does not)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    trials = tmp_path / "trials"
    ran = call_cli(tmp_path, "workload=poisson", "workload.num_requests=60", "backend.model=llama-3-8b",
                   "plan.space.hardware=[a100,h100]", "plan.space.tensor_parallel_size=[1]", "plan.space.replicas=[1]",
                   "plan.target_scale=6", "plan.search.max_scale=8", "plan.search.precision=0.5", "plan.wave=8",
                   "tracking.enabled=false",
                   f"plan.trials_dir={trials}", "hydra/launcher=submitit_local", "hydra.run.dir=out",
                   module="paged_bench.plan")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    record = json.loads((tmp_path / "out" / "plan.json").read_text())
    jobs = [d for d in (trials / ".submitit").iterdir() if d.name.isdigit()]  # a local job's id is its pid
    assert len(jobs) == record["num_trials"] > 0 and record["num_reused"] == 0  # every simulation a job
    assert record["winner"]["label"].startswith("h100 TP1 1x") and record["next_cheaper"]["label"].startswith("a100")
