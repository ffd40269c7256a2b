"""Shared test helpers: the real Hydra config composed with overrides (``config`` fixture), the
session's temporary folder that ``pytest -n``'s workers share (``tracking_support``), and the
order in which ``make test`` hands the test files to its workers (longest first)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paged_bench.run.compose import compose_config
from tests import tracking_support


@pytest.fixture
def config():
    return compose_config


@pytest.fixture(scope="session", autouse=True)
def session_folder(tmp_path_factory):
    """Under ``pytest -n``, each worker's temporary folder is in one of the session's: what is
    made once per session (a migrated MLflow store) goes there."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        tracking_support.SESSION_FOLDER = tmp_path_factory.getbasetemp().parent


# Seconds a worker spends in each of the longest files (make test's per-test durations summed
# by file, three runs of the whole suite, 2026-12-07; the rest take under 10 s each). make
# test hands a worker a whole file at a time (--dist loadfile), in collection order
# (--no-loadscope-reorder: else xdist puts the files with the most tests first, which left
# test_launchers.py's 100 s, most of it waiting on Ray, and test_cluster_experiments.py to start
# last, one worker running long after the others had finished). Longest first, the short
# files left at the end even the workers out.
FILE_SECONDS = {
    "test_tp_real.py": 122, "test_experiments.py": 122, "test_launchers.py": 99, "test_signals.py": 69,
    "test_remote_tracking.py": 60, "test_cluster_experiments.py": 56, "test_sweeps.py": 39,
    "test_unknown_keys.py": 32, "test_store_creation.py": 32, "test_tracking.py": 31, "test_plugins.py": 30,
    "test_report_edges.py": 29, "test_sweep_reruns.py": 27, "test_report.py": 26, "test_capacity.py": 26,
    "test_benchmark_scripts.py": 25, "test_properties.py": 24, "test_cli.py": 21, "test_cli_edges_cluster.py": 21,
    "test_tp_sim.py": 21, "test_serve_fuzz.py": 20, "test_loadgen.py": 20, "test_live_runs.py": 19,
    "test_cluster.py": 18, "test_engine_knobs.py": 16, "test_serve_features.py": 16, "test_sync.py": 16,
    "test_backend_real.py": 15, "test_tracking_config.py": 14, "test_cluster_disaggregation.py": 14,
    "test_serve_cli.py": 14, "test_plugin_catalog.py": 13, "test_native.py": 12, "test_calibrate.py": 12,
    "test_tp_comm.py": 12, "test_config.py": 11,
}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files longest first, each file's tests in their own order; every worker of a run
    collects the same order (xdist checks), as the sort depends on the names alone."""
    here = Path(__file__).parent
    first = {}  # a file's place in the collection, for the files not listed
    for item in items:
        first.setdefault(item.path, len(first))

    def seconds(path: Path) -> float:
        return FILE_SECONDS.get(path.name, 0) if path.parent == here else 0

    items.sort(key=lambda item: (-seconds(item.path), first[item.path]))  # stable: a file's own order kept
