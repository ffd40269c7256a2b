"""Sweeps through Hydra's distributed launchers (installed with the ``slurm`` and ``ray``
extras): ``submitit_local`` (submitit's local executor: each job its own process, as on a
SLURM node) and ``ray_local`` (a small Ray instance started for the sweep). Each sweep must
end as one MLflow parent run with a child per job, whichever process ran the job."""

from __future__ import annotations

import pytest

from tests.tracking_support import fresh_store, run_cli, runs_of


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
    _, runs = runs_of(uri, "paged_bench")
    (parent,) = [r for r in runs if r.data.tags.get("paged_bench.kind") == "sweep"]
    children = sorted((r for r in runs if r is not parent), key=lambda r: int(r.data.tags["job_num"]))
    assert parent.info.status == "FINISHED" and parent.data.tags["jobs"] == "2"
    assert [(r.info.run_name, r.info.status) for r in children] == [("max_batch=4", "FINISHED"),
                                                                      ("max_batch=8", "FINISHED")]  # fmt: skip
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    assert all(r.data.metrics["completed"] == 48 for r in children)
