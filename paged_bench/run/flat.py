"""A nested config as flat dotted keys (``scheduler.name``, ``workload.output_len.dist``): the
shape MLflow params take and the one reports compare runs by; and a key and a value as a
report shows them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Leaves of ``config`` keyed by their dotted path; lists stay whole (one value)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def display_key(key: str) -> str:
    """``scheduler.name`` -> ``scheduler``: a plugin section is named by its option."""
    return key[: -len(".name")] if key.endswith(".name") and key.count(".") == 1 else key


def display_value(value: Any) -> str:
    """A setting as the config spells it: ``true``/``false``/``null`` (YAML's, as swept:
    ``allocator.prefix_caching=false,true``), not Python's ``True``/``False``/``None``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)
