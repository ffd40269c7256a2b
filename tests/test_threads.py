"""Real backends pin their CPU threads to the job's share of the cores, and a sweep that would
run wall-clock jobs side by side on more threads than cores is refused before any job runs."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from paged_bench.cli import parallel
from paged_bench.errors import ConfigError
from paged_bench.run.threads import PARALLEL_JOBS_ENV, cpu_count, job_threads
from tests.test_cli import cli


def _sweep(launcher: dict, backend: str = "numpy", threads=1):
    return OmegaConf.create({"hydra": {"launcher": launcher, "runtime": {"choices": {"backend": backend}}},
                             "backend": {"threads": threads}})  # fmt: skip


JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"


def test_a_jobs_threads_are_its_share_of_the_cores(monkeypatch):
    monkeypatch.setenv(PARALLEL_JOBS_ENV, "2")
    assert job_threads("backend.threads", None) == max(1, cpu_count() // 2)
    assert job_threads("backend.threads", 3) == 3
    with pytest.raises(ConfigError, match="backend.threads=0 is not allowed"):
        job_threads("backend.threads", 0)
    monkeypatch.setenv(PARALLEL_JOBS_ENV, "1000")
    assert job_threads("backend.threads", None) == 1


def test_the_torch_backend_pins_its_share(monkeypatch):
    torch = pytest.importorskip("torch")
    from paged_bench.backends.torch import TorchBackend

    monkeypatch.setenv(PARALLEL_JOBS_ENV, str(cpu_count()))  # as many jobs as cores: one thread each
    backend = TorchBackend(model="tiny", device="cpu")
    assert backend.threads == 1
    backend.close()
    assert torch.get_num_threads() >= 1


def test_parallel_wall_clock_jobs_may_not_oversubscribe_the_cores(monkeypatch):
    monkeypatch.setattr(parallel, "cpu_count", lambda: 4)
    jobs = [["max_batch=2"], ["max_batch=4"], ["max_batch=8"], ["max_batch=16"]]
    parallel.prepare(_sweep({"_target_": JOBLIB, "n_jobs": 4}), jobs, 4)  # 4 x 1 thread on 4 cores: fine
    import os

    assert os.environ[PARALLEL_JOBS_ENV] == "4"
    with pytest.raises(ConfigError, match=r"hydra.launcher.n_jobs=4 .* at most 2 wall-clock jobs"):
        parallel.prepare(_sweep({"_target_": JOBLIB, "n_jobs": 4}, threads=2), jobs, 4)
    parallel.prepare(_sweep({"_target_": JOBLIB, "n_jobs": -1}, "torch", None), jobs * 2, 8)  # -1: one per core
    with pytest.raises(ConfigError, match="at most 4"):  # auto threads, but more jobs than cores
        parallel.prepare(_sweep({"_target_": JOBLIB, "n_jobs": 6}, "torch", None), jobs * 2, 8)
    parallel.prepare(_sweep({"_target_": JOBLIB, "n_jobs": 8}, "sim", None), jobs * 2, 8)  # virtual clock: any
    sim_then_numpy = [["backend=sim"], ["backend=numpy", "backend.threads=4"]]
    with pytest.raises(ConfigError, match="backend=numpy, 4 thread"):
        parallel.prepare(_sweep({"_target_": JOBLIB, "n_jobs": 2}, "sim", None), sim_then_numpy, 2)
    basic = {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}
    parallel.prepare(_sweep(basic, threads=8), jobs, 4)  # one at a time
    assert os.environ[PARALLEL_JOBS_ENV] == "1"


def test_the_command_refuses_an_oversubscribed_sweep(tmp_path):
    n = cpu_count() + 1
    proc, _ = cli(tmp_path, "-m", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={n}", "backend=numpy",
                  f"max_batch={','.join(str(b) for b in range(1, n + 1))}")  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: hydra.launcher.n_jobs={n} is not allowed")
    assert not list(tmp_path.glob("runs/multirun/*/*/0"))  # no job ran


def test_run_info_records_the_threads_a_run_resolved(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    import json

    from paged_bench.run.compose import compose_config
    from paged_bench.run.job import run_job

    small = ("workload=uniform", "workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=2",
             "backend.model=tiny", "tracking.enabled=false")  # fmt: skip
    monkeypatch.setenv(PARALLEL_JOBS_ENV, str(cpu_count()))  # threads: null is one core's share here
    run_job(compose_config("backend=torch", *small), tmp_path / "torch")
    info = json.loads((tmp_path / "torch" / "run_info.json").read_text())
    assert info["compute"] == {"devices": 1, "threads_per_device": 1}
    run_job(compose_config("backend=numpy", "backend.threads=2", *small), tmp_path / "numpy")
    info = json.loads((tmp_path / "numpy" / "run_info.json").read_text())
    assert info["compute"] == {"devices": 1, "threads_per_device": 2}
