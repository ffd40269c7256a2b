"""Shared test helpers: the real Hydra config composed with overrides (``config`` fixture)."""

from __future__ import annotations

import pytest

from paged_bench.run.compose import compose_config


@pytest.fixture
def config():
    return compose_config
