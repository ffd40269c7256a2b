"""``python -m paged_bench [overrides]``: one benchmark run (or a sweep with ``-m``), by Hydra.

Thin on purpose: Hydra composes the config, ``app.run_job`` builds and runs the engine and
writes the run's files into Hydra's run directory. A bad value is one line on stderr and a
non-zero exit; a run that stops early still writes what it measured.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from paged_bench.app import run_job
from paged_bench.errors import PagedBenchError
from paged_bench.outputs import format_summary


def _fail(message: str, code: int, multirun: bool) -> None:
    print(f"error: {message}", file=sys.stderr)
    if not multirun:  # in a sweep the other jobs go on; the job's files say it failed
        sys.exit(code)


@hydra.main(version_base="1.3", config_path="pkg://paged_bench.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
        outcome = run_job(config, Path(hydra_cfg.runtime.output_dir))
    except PagedBenchError as e:
        return _fail(str(e), e.exit_code, multirun)
    except OmegaConfBaseException as e:
        return _fail(str(e).splitlines()[0], 2, multirun)
    picked = hydra_cfg.runtime.choices
    choices = ", ".join(f"{k}={picked.get(k, v)}" for k, v in outcome.choices.items())
    print(format_summary(outcome.summary, f"{choices} -> {outcome.run_dir}"))
    if outcome.error:
        _fail(f"run {outcome.status}: {outcome.error} (results so far are in {outcome.run_dir})",
              130 if outcome.status == "interrupted" else 1, multirun)


def _one_line(e: HydraException) -> str:
    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in e.missing_cfg_file:
        group, _, option = e.missing_cfg_file.rpartition("/")
        return f"{group}={option} is not allowed: one of {', '.join(e.options or []) or '(none available)'}"
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if e.__cause__ is not None:
        lines.append(str(e.__cause__).splitlines()[0])
    return " ".join(lines[:3])


def cli() -> None:
    """The command: Hydra's own composition errors (an unknown option, a malformed override)
    become one line too, unless HYDRA_FULL_ERROR=1 asks for Hydra's full report."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return main()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # make Hydra raise instead of printing its report
    try:
        main()
    except HydraException as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
