"""The resolved config a command would run with, composed in-process (tests, benchmarks,
notebooks, and the commands that take Hydra overrides without being Hydra apps)."""

from __future__ import annotations

from typing import Any


def compose_config(*overrides: str, config_name: str = "config") -> dict[str, Any]:
    """``python -m paged_bench <overrides>``'s config as a plain dict (``config_name="serve"``:
    the server's). Hydra's and OmegaConf's errors propagate for the caller to report."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("paged_bench.conf", version_base="1.3"):
        return OmegaConf.to_container(compose(config_name, overrides=list(overrides)), resolve=True)
