"""Shared test helpers: the real Hydra config composed with overrides (``config`` fixture), and
the session's temporary folder that ``pytest -n``'s workers share (``tracking_support``)."""

from __future__ import annotations

import os

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
