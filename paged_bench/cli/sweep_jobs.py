"""Which jobs a sweep's config makes, and what is refused before the first of them runs: a
sweep of no jobs, a sweep over experiments that are sweeps themselves, jobs whose tracking
settings are bad, a value every job refuses (each job's config is read as its run will read
it, ``run.config.BenchConfig``), jobs that would oversubscribe the cores. Hydra's basic
sweeper expands the overrides; this reads them as it does."""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from paged_bench.cli import parallel
from paged_bench.cluster.spec import cluster_spec
from paged_bench.errors import ConfigError
from paged_bench.run.bench import build_workload
from paged_bench.run.compose import check_settings, unknown_override
from paged_bench.run.config import BenchConfig
from paged_bench.run.tracking_settings import TrackingSettings


def sweep_overrides(config: DictConfig) -> list[Any]:
    """The sweep's overrides as the basic sweeper sees them: ``hydra.sweeper.params``, then
    the command line's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    lines = [f"{k}={v}" for k, v in params.items()] + list(OmegaConf.select(config, "hydra.overrides.task") or [])
    return OverridesParser.create().parse_overrides(lines)


def job_overrides(config: DictConfig) -> list[list[str]]:
    """Each job's overrides, in launch order, as the basic sweeper expands them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return [job for batch in BasicSweeper.split_arguments(sweep_overrides(config), None) for job in batch]


def override_keys(overrides: list[str]) -> set[str]:
    """The keys a job's overrides set (``+workload.rate=4`` -> ``workload.rate``)."""
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides}


def unswept_params(params: dict[str, str], overrides: list[str]) -> dict[str, str]:
    """The sweeper params (``hydra.sweeper.params``) that ``overrides`` give no value of."""
    given = override_keys(overrides)
    return {k: v for k, v in params.items() if k not in given}


def count_jobs(config: DictConfig) -> int | None:
    """How many jobs the basic sweeper will launch (None for other sweepers)."""
    if not str(OmegaConf.select(config, "hydra.sweeper._target_") or "").endswith("BasicSweeper"):
        return None
    try:
        return len(job_overrides(config))
    except Exception:  # noqa: BLE001  (a total is a nicety; the sweeper reports bad overrides itself)
        return None


def check_jobs(config: DictConfig, total: int | None) -> TrackingSettings:
    """Before any job: every job's tracking settings are checked (the sweep's own are returned),
    and jobs side by side learn their share of the cores (a sweep that would oversubscribe them
    for wall-clock backends stops here). Hydra only warns about a callback's exceptions, so
    this one exits."""
    try:
        jobs = job_overrides(config) if total is not None else []
    except Exception:  # noqa: BLE001  (the sweeper reports bad overrides itself)
        jobs = []
    try:
        _refuse_chdir(config)
        _refuse_no_jobs(config, total)
        _refuse_experiments_that_sweep(config, jobs)
        _refuse_unknown_keys(config, jobs)
        _refuse_routers_without_a_cluster(config, jobs)
        tracking, *_ = TrackingSettings.for_jobs(config, jobs)  # every job's, before the first job
        _refuse_sweeping_the_record(config)
        _refuse_what_no_job_can_run(config, jobs)
        parallel.prepare(config, jobs, total)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_code) from e
    return tracking


def chdir_refused() -> Exception:
    """``hydra.job.chdir=true``: relative paths (the default MLflow store, the sweep's folder, a
    trace's) were read from each job's folder: every job made a store of its own there, and a
    sweep's jobs were logged twice. Each job's files go to its folder without it."""
    return ConfigError("hydra.job.chdir", True, "false (paged_bench writes each job's files into its folder itself; "
                       "run from there, relative paths such as the default MLflow store's were the folder's)")  # fmt: skip


def _refuse_chdir(config: DictConfig) -> None:
    if OmegaConf.select(config, "hydra.job.chdir"):
        raise chdir_refused()


def _refuse_no_jobs(config: DictConfig, total: int | None) -> None:
    """A sweep of no jobs (``max_batch='range(4,4)'``) would end as a success that measured nothing."""
    if total != 0:
        return
    empty = [o for o in safe_overrides(config) if o.is_sweep_override() and not list(o.sweep_string_iterator())]
    key, value = (empty[0].get_key_element(), _typed_value(empty[0])) if empty else ("-m", "")
    raise ConfigError(key, value, "a sweep of at least one value (this one has no jobs)")


def _refuse_experiments_that_sweep(config: DictConfig, jobs: list[list[str]]) -> None:
    """Swept over (``+experiment=a,b``), an experiment whose config is a sweep would run as one
    job of its defaults: the basic sweeper reads the params of the command line's config only."""
    swept = [o for o in safe_overrides(config) if o.is_sweep_override() and o.key_or_group == "experiment"]
    if not swept:
        return
    sweeps = [name for name, overrides in _experiment_jobs(jobs).items() if _is_sweep(config, overrides)]
    if sweeps:
        are = "is a sweep of its" if len(sweeps) == 1 else "are sweeps of their"
        raise ConfigError(swept[0].get_key_element(), _typed_value(swept[0]),
                          f"{', '.join(sweeps)} {are} own: run one such experiment per command "
                          "(python -m paged_bench -m +experiment=NAME)")  # fmt: skip


def _refuse_unknown_keys(config: DictConfig, jobs: list[list[str]]) -> None:
    """A misspelled key (``max_bach=2,4``, or ``+max_bach=...``): every job would fail with it,
    after the sweep's folder and MLflow parent run were made. The first job's config tells."""
    if not jobs:
        return
    try:
        job_config = _load_job(config, jobs[0])
    except Exception as e:  # other refusals: the launcher reports them
        if (error := unknown_override(e)) is not None:
            raise error from e
        return
    check_settings(job_config)


def _refuse_routers_without_a_cluster(config: DictConfig, jobs: list[list[str]]) -> None:
    """A sweep over routers (``router=a,b``), or with one, on one replica: every job but round
    robin's would fail at its start with the same line (a router needs a cluster), after the
    first ones ran. The line names the router a job would refuse (``router=round_robin,least_kv``
    was named whole, round robin with it, next to "round_robin (the default) ... is allowed")."""
    routers = [o for o in safe_overrides(config) if o.key_or_group.split(".")[0] == "router"]
    for overrides in jobs if routers else ():
        try:
            cluster_spec(_job_config(config, overrides))
        except ConfigError as e:
            if e.key == "router":  # the job's other settings: its launcher reports them
                raise ConfigError(e.key, e.value, f"{e.allowed} (set cluster.replicas=N, N >= 2, to compare "
                                                  "routers)") from e  # fmt: skip


def _refuse_sweeping_the_record(config: DictConfig) -> None:
    """``experiment_name`` or a ``tracking`` setting swept: its jobs measure the same thing, so
    the sweep's table shows identical rows told apart by nothing, and a sweep is one parent run
    in one MLflow experiment (``experiment_name=a,b``: both jobs went to the parent's)."""
    for o in safe_overrides(config):
        key = o.key_or_group.lstrip("+~")
        swept = o.is_sweep_override() and len(set(o.sweep_string_iterator())) > 1
        if swept and (key == "experiment_name" or key.startswith("tracking.")):
            raise ConfigError(o.get_key_element(), _typed_value(o), "one value per sweep (it says where and how "
                              "the sweep is recorded, not what its jobs run): run one sweep per value")  # fmt: skip


def _refuse_what_no_job_can_run(config: DictConfig, jobs: list[list[str]]) -> None:
    """A value every job refuses (``-m max_batch=2,4 workload.rate=-1``): each job failed with
    the same line, after the sweep's folder and a FAILED parent run were made. Each job's
    config is read as its run reads it (every value checked, its plugins loaded, none built but
    its workload), in order until one passes (the first, most often); a value that only some
    jobs refuse is left to them, and the sweep's table shows which."""
    refused = None
    for overrides in jobs:
        if not (job_config := _job_config(config, overrides)):
            return  # it does not compose: its launcher says why
        try:
            job = BenchConfig.from_config(job_config)
            job.verify()
            build_workload(job)
        except ConfigError as e:
            refused = refused or e
            continue
        except Exception:  # noqa: BLE001  (a plugin's own trouble building its workload: its job reports it)
            return
        return
    if refused is not None:
        raise refused


def _load_job(config: DictConfig, overrides: list[str]) -> DictConfig:
    """The job's config as its launcher composes it (``hydra`` included); Hydra's error if it
    does not compose."""
    from hydra.core.global_hydra import GlobalHydra

    return GlobalHydra.instance().config_loader().load_sweep_config(config, overrides)


def _job_config(config: DictConfig, overrides: list[str]) -> dict[str, Any]:
    """The job's resolved config less ``hydra``; {} if it does not compose (the launcher
    reports that)."""
    try:
        job_config = _load_job(config, overrides)
        with open_dict(job_config):
            del job_config["hydra"]
        return OmegaConf.to_container(job_config, resolve=True)
    except Exception:  # noqa: BLE001
        return {}


def _typed_value(override: Any) -> str:
    """An override's value as the command line typed it (``range(4,4)``)."""
    return override.input_line.split("=", 1)[1]


def _experiment_jobs(jobs: list[list[str]]) -> dict[str, list[str]]:
    """The first job's overrides of each experiment the jobs run."""
    first: dict[str, list[str]] = {}
    for overrides in jobs:
        for key, _, value in (o.partition("=") for o in overrides):
            if key.lstrip("+~") == "experiment":
                first.setdefault(value, overrides)
    return first


def _is_sweep(config: DictConfig, overrides: list[str]) -> bool:
    """Whether the job's config (composed as its launcher will) sweeps keys its overrides leave."""
    try:
        job_config = _load_job(config, overrides)
    except Exception:  # noqa: BLE001  (a config that does not compose: the launcher reports it)
        return False
    params = OmegaConf.select(job_config, "hydra.sweeper.params") or {}
    return bool(unswept_params(dict(params), overrides))


def safe_overrides(config: DictConfig) -> list[Any]:
    try:
        return sweep_overrides(config)
    except Exception:  # noqa: BLE001  (the sweeper reports bad overrides itself)
        return []


def value_text(override: Any) -> str:
    if override.is_sweep_override():
        return ",".join(override.sweep_string_iterator())
    return str(override.value())
