"""Finished runs on disk -> records that a report compares.

A run directory holds ``summary.json``, ``requests.csv``, ``steps.csv``, ``run_info.json``
(written by ``outputs.write_run``) and ``config.yaml`` (the resolved config, written by the
CLI through ``save_config``; older runs fall back to Hydra's ``.hydra/config.yaml``). A sweep
directory holds one run directory per job, named by its job number. A job that failed before
it measured anything has only ``run_info.json`` and ``config.yaml``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from paged_bench.errors import PagedBenchError
from paged_bench.report.axes import Question, declared_section, resolve
from paged_bench.results.whole_files import write_whole
from paged_bench.run.flat import display_key, display_value, flatten

CONFIG_FILE = "config.yaml"
RUN_INFO = "run_info.json"  # the run's status, error, choices, name, start and end
TRACKING_URI_KEY = "tracking_uri"  # in RUN_INFO and sweep.json: the store it is meant for (store.recorded_uri)
REPORT_DIR = "report"  # where a report of a directory goes; never read back as a run
NOT_RUNS = (REPORT_DIR, "mlartifacts", "plots")  # copies of runs' files (the embedded store's artifacts)
_RUN_MARKERS = ("summary.json", RUN_INFO)  # what only a run writes (a config.yaml may be anyone's)
_CONFIG_MARKERS = (CONFIG_FILE, ".hydra/config.yaml")  # a run's, when they hold paged_bench's plugin sections
# the columns a report reads from a run's tables (the plots): a file without them was not written by a run
TABLE_COLUMNS = {"requests": ("ttft_ms",), "steps": ("time", "duration", "kv_live_slots", "kv_reserved_slots",
                                                     "preemptions")}  # fmt: skip
# config keys that say how a run was recorded, not what was measured
_NOT_DIMENSIONS = ("tracking.", "report.", "experiment_name")
# plugin choices come first when picking the dimension compared side by side
_POLICY_ORDER = ("scheduler.name", "allocator.name", "backend.name", "target.name", "workload.name")


def save_config(run_dir: Path, config: Mapping[str, Any]) -> Path:
    """Write the resolved config beside the run's results (a run's own record of its config)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return write_whole(run_dir / CONFIG_FILE, yaml.safe_dump(dict(config), sort_keys=False))


def update_run_info(run_dir: Path, fields: Mapping[str, Any]) -> Path:
    """Add ``fields`` to the run's ``run_info.json`` (created if the run wrote none)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_INFO
    try:
        info = read_json(path)
    except RunFileError:  # an earlier run's, cut short: this run's record starts over
        info = {}
    info.update(fields)
    return write_whole(path, json.dumps(info, indent=2, default=str) + "\n")



@dataclass
class Run:
    """One run directory: its config, summary figures and status; tables are read on demand."""

    path: Path
    job: int | None  # the Hydra job number in a sweep (its order), None for a single run
    status: str  # finished | failed | interrupted
    error: str | None
    config: dict[str, Any]
    summary: dict[str, Any]
    source: str = ""  # where the run comes from: its folder, or its MLflow run (runs:/<id>)
    choices: dict[str, str] = field(default_factory=dict)  # config group -> option (workload=seed)
    overrides: list[str] | None = None  # its command line's (run_info.json), where recorded
    _tables: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def flat_config(self) -> dict[str, Any]:
        return flatten(self.config)

    @property
    def compared_config(self) -> dict[str, Any]:
        """``flat_config`` with each plugin's name as the option chosen: ``workload=seed`` runs
        the ``poisson`` plugin, and a sweep over workloads put it in poisson's column."""
        flat = self.flat_config
        for kind, option in self.choices.items():
            if f"{kind}.name" in flat and isinstance(option, str):
                flat[f"{kind}.name"] = option
        return flat

    def table(self, name: str):
        """``requests`` or ``steps`` as a DataFrame, or None when the run has none."""
        if name not in self._tables:
            import pandas as pd

            path = self.path / f"{name}.csv"
            # low_memory=False: one pass types each column whole (in chunks, a long run's mostly
            # empty error column came out mixed, with a DtypeWarning on every report)
            try:
                df = pd.read_csv(path, low_memory=False) if path.is_file() and path.stat().st_size else None
            except (ValueError, OSError) as e:  # pandas' ParserError is a ValueError
                raise RunFileError(path, f"not a CSV table ({str(e).splitlines()[0]})") from e
            missing = [c for c in TABLE_COLUMNS.get(name, ()) if df is not None and c not in df]
            if missing:
                raise RunFileError(path, f"has no column {', '.join(missing)}")
            self._tables[name] = df if df is not None and len(df) else None
        return self._tables[name]


class RunFileError(PagedBenchError):
    """A run's file that is there but is not what the run wrote (cut short, or edited)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}; was it cut short or edited? (fix or remove it)")


def read_json(path: Path) -> dict[str, Any]:
    """A run's JSON record; {} when the file is not there (the run never wrote it)."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunFileError(path, f"not JSON ({e})") from e
    if not isinstance(value, dict):
        raise RunFileError(path, f"a JSON {type(value).__name__}, not an object")
    return value


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        value = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise RunFileError(path, f"not YAML ({str(e).splitlines()[0]})") from e
    if not isinstance(value, dict):
        raise RunFileError(path, f"a YAML {type(value).__name__}, not a mapping")
    return value


def _read_config(path: Path) -> dict[str, Any]:
    if (path / CONFIG_FILE).is_file():
        return read_yaml(path / CONFIG_FILE)
    hydra_config = path / ".hydra" / "config.yaml"
    if hydra_config.is_file():  # a run from before config.yaml was written: resolve Hydra's copy
        from omegaconf import OmegaConf

        try:
            return OmegaConf.to_container(OmegaConf.load(hydra_config), resolve=True)
        except Exception:  # noqa: BLE001  (an interpolation only Hydra resolves, e.g. ${now:...})
            return OmegaConf.to_container(OmegaConf.load(hydra_config), resolve=False)
    return {}


def is_run_dir(path: Path) -> bool:
    """A folder a paged_bench run wrote: its records, or (a job that failed before writing them)
    its config with the plugin sections; another tool's config.yaml is not a run."""
    if any((path / marker).is_file() for marker in _RUN_MARKERS):
        return True
    for marker in _CONFIG_MARKERS:
        if (path / marker).is_file():
            try:
                config = read_yaml(path / marker)
            except RunFileError:
                return False
            return all(isinstance(config.get(kind), dict) for kind in ("workload", "scheduler", "backend"))
    return False


def run_outcome(info: dict[str, Any], summary: dict[str, Any]) -> tuple[str, str | None]:
    """A run's status and error from its files: a job whose process was killed (SIGKILL, its
    node lost) left its start record only, no status, and no error to say so."""
    status = info.get("status") or ("finished" if summary else "failed")
    error = info.get("error")
    if status == "failed" and not error and not summary:
        error = "no results: the job stopped before it wrote any (its process was killed, or its machine lost)"
    return status, error


def load_run(path: Path) -> Run:
    info = read_json(path / RUN_INFO)
    summary = read_json(path / "summary.json")
    status, error = run_outcome(info, summary)
    job = int(path.name) if path.name.isdigit() else None
    choices = info.get("choices") if isinstance(info.get("choices"), dict) else {}
    overrides = info.get("overrides") if isinstance(info.get("overrides"), list) else None
    return Run(path, job, status, error, _read_config(path), summary, str(path), choices, overrides)


def find_runs(path: Path, depth: int = 4, unreadable: list[RunFileError] | None = None) -> list[Run]:
    """Every run in ``path``: the run itself, a sweep's jobs, or all runs below a folder. A run
    whose files cannot be read raises, or with ``unreadable`` given is left out and noted there."""
    path = Path(path)
    if is_run_dir(path):
        try:
            return [load_run(path)]
        except RunFileError as e:
            if unreadable is None:
                raise
            unreadable.append(e)
            return []
    if depth == 0 or not path.is_dir():
        return []
    runs: list[Run] = []
    for child in path.iterdir():
        if child.is_dir() and child.name not in NOT_RUNS and not child.name.startswith("."):
            runs += find_runs(child, depth - 1, unreadable)
    return sorted(runs, key=lambda r: (str(r.path.parent), r.job if r.job is not None else math.inf, r.path.name))


def _comparable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True, default=str) if isinstance(value, (list, dict)) else value


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


@dataclass
class RunSet:
    """Runs to compare, and what varies between them.

    ``dims`` are the config keys whose values differ (a key that some runs lack is an option
    of one plugin, not a dimension); ``policy`` is the one compared side by side (a plugin
    choice or another non-numeric key, or the one the experiment declares, ``report.compare``),
    ``axes`` the numeric ones (e.g. ``max_batch``); ``question`` the axes the experiment
    declares (``report.x``, ``series``, ``facets``: report/axes.py), ``notes`` what was wrong
    with them."""

    runs: list[Run]
    dims: list[str]
    policy: str | None
    axes: list[str]
    question: Question = field(default_factory=Question)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, runs: list[Run]) -> RunSet:
        flats = [r.compared_config for r in runs]
        keys = [k for k in (flats[0] if flats else {}) if all(k in f for f in flats)]
        keys = [k for k in keys if not k.startswith(_NOT_DIMENSIONS)]
        dims: list[str] = []
        columns: list[list[Any]] = []
        # shortest names first, so that of twins (interpolations) max_batch beats scheduler.max_batch
        for key in sorted(keys, key=lambda k: (k not in _POLICY_ORDER, k.count("."), keys.index(k))):
            column = [_comparable(f[key]) for f in flats]
            if len(set(map(str, column))) > 1 and column not in columns:
                dims.append(key)
                columns.append(column)
        numeric = [k for k in dims if _numeric([f[k] for f in flats])]
        others = [k for k in dims if k not in numeric]
        ranked = sorted(others, key=lambda k: _POLICY_ORDER.index(k) if k in _POLICY_ORDER else len(_POLICY_ORDER))
        settings = {k for f in flats for k in f}
        question, notes = resolve(declared_section([r.config for r in runs]), settings, dims, numeric)
        policy = question.compare or (ranked[0] if ranked else None)
        return cls(runs, dims, policy, numeric, question, notes)

    def value(self, run: Run, key: str) -> Any:
        return run.compared_config.get(key)

    def label(self, run: Run, keys: list[str] | None = None) -> str:
        keys = self.dims if keys is None else keys
        if not keys:
            return run.path.name if run.job is None else f"job {run.job}"
        return " ".join(f"{display_key(k)}={display_value(self.value(run, k))}" for k in keys)

    def policy_values(self) -> list[Any]:
        """The policy's values in sweep order: the first one is the baseline."""
        seen: list[Any] = []
        for run in self.runs:
            v = self.value(run, self.policy) if self.policy else None
            if v not in seen:
                seen.append(v)
        return seen

    def policy_label(self, value: Any) -> str:
        """A compared value as a column or a legend names it: ``continuous``; a number with its
        setting's name (``tensor_parallel_size=2``), which alone would say nothing."""
        if self.policy in self.axes:
            return f"{display_key(self.policy).rsplit('.', 1)[-1]}={display_value(value)}"
        return display_value(value)

    def report_metrics(self) -> list[str] | None:
        """The metrics the runs' experiment asks its report to show (``report.metrics``)."""
        for run in self.runs:
            metrics = (run.config.get("report") or {}).get("metrics")
            if metrics:
                return list(metrics)
        return None

    def experiment_name(self) -> str | None:
        names = {r.config.get("experiment_name") for r in self.runs if r.config.get("experiment_name")}
        return names.pop() if len(names) == 1 else None


# a single engine's figures that a cluster's summary has for all its replicas together
SINGLE_ENGINE_CLUSTER_KEYS = ("kv_live_slots_peak", "kv_reserved_slots_peak", "kv_capacity_blocks", "kv_capacity_tokens")


def derived_figures(run: Run) -> dict[str, float]:
    """Figures a report adds to the summary: the peak block-table size of a paged run, and a
    single engine's whole-cluster figures (its own: one replica), so that a sweep over
    ``cluster.replicas`` from 1 compares like with like."""
    flat, summary = run.flat_config, run.summary
    reserved = summary.get("kv_reserved_slots_peak")
    block_size = flat.get("allocator.block_size", flat.get("block_size"))
    figures = {}
    if flat.get("allocator.name") == "paged" and reserved is not None and block_size:
        figures["block_table_entries_peak"] = reserved / block_size
    if summary and "num_replicas" not in summary:
        figures.update({f"cluster_{key}": summary[key] for key in SINGLE_ENGINE_CLUSTER_KEYS if key in summary})
    return figures

