"""A plan's simulations, through Hydra's launcher as a sweep's jobs go: ``hydra/launcher``
picks it (basic: one after the other in this process; joblib: parallel processes; Ray or
SLURM: a cluster), each job composed from the plan's config and its own overrides, run by
``trial_task`` into its own folder (``hydra.sweep.dir``/its key), whose ``trial.json`` a
rerun of the plan reads instead of running it again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.callbacks import Callbacks
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_automatic_config_search_path
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from paged_bench.capacity import trial
from paged_bench.capacity.slo import Slo
from paged_bench.errors import PagedBenchError

CONFIG_PATH = "pkg://paged_bench.conf"
PLAN_CONFIG = "plan"


def run_config(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """The run config a plan's config holds: itself less ``plan`` (which ``python -m paged_bench`` refuses)."""
    if isinstance(cfg, DictConfig):
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.pop("hydra", None)  # a composed job's: its interpolations need a job number
        cfg = OmegaConf.to_container(cfg, resolve=True)
    config = dict(cfg)
    config.pop("plan", None)
    return config


def trial_task(cfg: DictConfig) -> dict[str, Any]:
    """One launcher job: simulate, record ``trial.json`` in the job's folder, return the record."""
    slo = Slo.from_config(OmegaConf.to_container(cfg.plan.slo, resolve=True))
    hc = HydraConfig.get()
    overrides = [o for o in hc.overrides.task if not o.startswith(("plan.", "hydra."))]
    try:
        record = trial.simulate(run_config(cfg), slo)
    except PagedBenchError as e:  # a config the engine refuses: a failure of this candidate, said in a line
        record = {"passed": False, "missed": [], "error": str(e), "figures": {}, "summary": {}, "cpu_s": 0.0,
                  "stopped_early": None}  # fmt: skip
    record.update(scale=float(cfg.plan.trial.scale), overrides=overrides)
    trial.write(Path(hc.runtime.output_dir), record)
    return record


# what changes no simulation: left out of a trial's key
UNKEYED = ("tracking", "experiment_name", "report")


def trial_key(base: Mapping[str, Any], overrides: Sequence[str], slo: Slo) -> str:
    """A trial's folder name: the plan's run config (``base``, resolved), the overrides that make
    it this trial's (candidate, scale) and the SLO it was stopped early against; the same plan
    rerun, however launched or tracked, finds it again."""
    run = {k: v for k, v in base.items() if k not in UNKEYED}
    text = json.dumps([run, sorted(overrides), [vars(lim) for lim in slo.limits]], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def subdir_override(key: str) -> str:
    """The override that puts a job in the folder ``key``, quoted: Hydra reads a bare hex key such
    as ``3e51234567890123`` as a number (that one as inf, and ``0123`` as 123)."""
    return f"hydra.sweep.subdir='{key}'"


@dataclass(frozen=True)
class TrialJob:
    key: str
    overrides: list[str]  # the run's, as python -m paged_bench takes them
    scale: float


class TrialLauncher:
    """Hydra's configured launcher, set up once for a plan's config, launched once per wave."""

    def __init__(self, cfg: DictConfig, trials_dir: Path) -> None:
        self.hydra = HydraConfig.get()
        self.hydra_node = HydraConfig.instance().cfg
        self.config = cfg.copy()
        with open_dict(self.config):
            self.config.hydra = OmegaConf.create(OmegaConf.to_container(self.hydra, resolve=False))
            self.config.hydra.sweep.dir = str(trials_dir)
        OmegaConf.set_readonly(self.config.hydra, True)
        self.trials_dir = trials_dir
        search_path = create_automatic_config_search_path(None, None, CONFIG_PATH)
        self.loader = ConfigLoaderImpl(config_search_path=search_path)
        self.launched = 0
        self._launcher: Any = None

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        """The plan's config with ``overrides`` on it, as a job of it gets it."""
        return self.loader.load_configuration(PLAN_CONFIG, list(self.hydra.overrides.task) + list(overrides),
                                              RunMode.RUN)  # fmt: skip

    def launch(self, jobs: Sequence[TrialJob]) -> list[dict[str, Any]]:
        if not jobs:
            return []
        if self._launcher is None:
            context = HydraContext(config_loader=self.loader, callbacks=Callbacks(self.config))
            self._launcher = Plugins.instance().instantiate_launcher(hydra_context=context, task_function=trial_task,
                                                                     config=self.config)  # fmt: skip
        task = [o for o in self.hydra.overrides.task if not o.startswith("hydra")]
        job_overrides = [[*task, *job.overrides, f"+plan.trial.scale={job.scale}", subdir_override(job.key),
                          f"hydra.sweep.dir={self.trials_dir}", "hydra.output_subdir=null"] for job in jobs]  # fmt: skip
        try:
            returns = self._launcher.launch(job_overrides, initial_job_idx=self.launched)
        finally:
            HydraConfig.instance().cfg = self.hydra_node  # a launcher leaves the last job's behind
        self.launched += len(jobs)
        out = []
        for job, ret in zip(jobs, returns):
            if ret.status != JobStatus.COMPLETED:
                raise ret._return_value  # a bug in a job: its traceback, as a sweep's
            out.append(ret.return_value)
        return out
