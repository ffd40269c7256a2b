"""The benchmark scripts whose figures the docs quote still run, each cut to its smallest form:
a config check added to the engine once broke ``cluster_azure.py`` (its ``max_model_len`` was
past the model's positions) and nothing noticed until its figures were regenerated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPTS = {
    "cluster_azure": (["--limit", "300", "--replicas", "2"], "cluster / engine replica-steps/s: "),
    "metrics_outputs": (["--repeats", "1", "workload.num_requests=300"], "same figures: True; same table content"),
    "sim_speed": (["--cases", "seed", "--repeats", "1"], "| seed | compiled | "),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_script_runs(script):
    args, expected = SCRIPTS[script]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert expected in done.stdout, done.stdout[-2000:]
