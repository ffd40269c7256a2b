"""Shared test helpers: compose the real Hydra config with overrides, and build engines."""

from __future__ import annotations

from typing import Any

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf


def compose_config(*overrides: str) -> dict[str, Any]:
    """The resolved config ``python -m paged_bench <overrides>`` would run with."""
    with initialize_config_module("paged_bench.conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture
def config():
    return compose_config
