"""The winner's exact ``python -m paged_bench`` command line: the run config a plan simulated,
said as overrides of the main command's own config (``conf/config.yaml``).

A plan's config is the main one plus what ``conf/plan.yaml`` and a plan experiment set, which
a plain run knows nothing of: so the command names each config group's option the plan ran
(``workload=azure_conv``) and then every value that still differs from what those options give
(``backend.model=llama-3-70b``), and is checked to compose to the very config simulated.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

GROUPS = ("workload", "scheduler", "allocator", "backend", "target", "cluster", "router")
SKIP = ("hydra",)


def _main_config(loader: Any, overrides: Sequence[str]) -> dict[str, Any]:
    """``conf/config.yaml`` with ``overrides``, resolved (less Hydra's own section)."""
    cfg = loader.load_configuration("config", list(overrides), RunMode.RUN)
    with open_dict(cfg):
        cfg.pop("hydra", None)
    return OmegaConf.to_container(cfg, resolve=True)


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return json.dumps(value).replace('"', "")
    return str(value)


def _diff(want: Mapping[str, Any], have: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in want.items():
        if not prefix and key in SKIP:
            continue
        path = f"{prefix}{key}"
        if key not in have:
            out.append(f"+{path}={_value(value)}")
        elif isinstance(value, Mapping) and isinstance(have[key], Mapping):
            out.extend(_diff(value, have[key], f"{path}."))
        elif value != have[key]:
            out.append(f"{path}={_value(value)}")
    return out


def command_overrides(loader: Any, run: Mapping[str, Any], choices: Mapping[str, str]) -> list[str]:
    """The overrides that make the main command's config ``run`` (``loader``: a Hydra config
    loader of paged_bench's configs); ValueError if they do not."""
    groups = [f"{g}={choices[g]}" for g in GROUPS if choices.get(g)]
    # the top level's knobs first: a section's copy of one (scheduler.max_batch: ${max_batch}) then follows
    knobs = {k: v for k, v in run.items() if not isinstance(v, Mapping)}
    first = groups + _diff(knobs, _main_config(loader, groups))
    overrides = first + _diff(run, _main_config(loader, first))
    if _main_config(loader, overrides) != {k: v for k, v in run.items() if k not in SKIP}:
        raise ValueError(f"the overrides {overrides} do not compose to the simulated config")
    return overrides


def command_line(loader: Any, run: Mapping[str, Any], choices: Mapping[str, str]) -> str:
    return shlex.join(["python", "-m", "paged_bench", *command_overrides(loader, run, choices)])
