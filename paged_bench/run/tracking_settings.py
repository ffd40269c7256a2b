"""Where a run is logged, typed and checked before it runs: the ``tracking`` section and the
MLflow experiment (``experiment_name``). Found after the run, a bad setting would cost its
tracking; a sweep checks every job's before the first runs (``for_jobs``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from paged_bench.errors import check, check_int
from paged_bench.tracking import store

MAX_EXPERIMENT_NAME = 500  # MLflow's limit


@dataclass(frozen=True)
class TrackingSettings:
    """``experiment_name`` (null: paged_bench's own) and ``tracking.*`` (conf/config.yaml): whether
    runs are logged, to which store (null: ``$MLFLOW_TRACKING_URI``, else SQLite under ./runs),
    how many points per step-wise series, and whether a run's own plots go with it."""

    experiment_name: str | None = "paged_bench"
    enabled: bool = True
    uri: str | None = None
    step_metrics: int = 100
    plots: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        name = self.experiment_name
        ok = name is None or (isinstance(name, str) and name.strip() != "" and len(name) <= MAX_EXPERIMENT_NAME)
        quote = f" (a number is a name in quotes: \"experiment_name='{name}'\")" if isinstance(name, (int, float)) else ""
        check(ok, "experiment_name", name, f"a name of 1 to {MAX_EXPERIMENT_NAME} characters (the MLflow experiment), "
                                           f"or null{quote}")  # fmt: skip
        check(isinstance(self.enabled, bool), "tracking.enabled", self.enabled, "true or false")
        check_int("tracking.step_metrics", self.step_metrics, 0)
        # isinstance, not ``in (True, False)``: 1 == True, and 1 then meant no plots
        check(isinstance(self.plots, bool) or self.plots == "auto", "tracking.plots", self.plots, "auto, true or false")
        if self.enabled:  # the store is looked at only when something will be logged to it
            store.check_uri(self.uri, "tracking.uri")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TrackingSettings:
        """A resolved config's tracking settings; ConfigError for the first bad one."""
        section = config.get("tracking") or {}
        keys = [f.name for f in fields(cls)][1:]  # the tracking section's
        check(isinstance(section, Mapping), "tracking", section, f"a mapping with keys {', '.join(keys)}")
        for key, value in section.items():
            check(key in keys, f"tracking.{key}", value, f"one of {', '.join(keys)}")
        return cls(config.get("experiment_name"), **section)

    @classmethod
    def for_jobs(cls, config: Mapping[str, Any], jobs: list[list[str]]) -> list[TrackingSettings]:
        """The tracking settings of a sweep's config and of each of its jobs (``jobs``: their
        overrides, as the sweeper expands them), checked before the first job runs."""
        base = {"experiment_name": config.get("experiment_name"), "tracking": dict(config.get("tracking") or {})}
        return [cls.from_config(base), *(cls.from_config(_overridden(base, overrides)) for overrides in jobs)]

    @property
    def experiment(self) -> str:
        """The MLflow experiment runs land in."""
        return self.experiment_name or "paged_bench"

    def section(self) -> dict[str, Any]:
        """The ``tracking`` section, as the tracking helper reads it."""
        return {"enabled": self.enabled, "uri": self.uri, "step_metrics": self.step_metrics, "plots": self.plots}

    def wants_plots(self, in_sweep: bool) -> bool:
        """A run's own PNGs: single runs by default (a sweep's parent gets the comparison plots)."""
        return self.plots is True or (self.plots == "auto" and not in_sweep)


def _overridden(base: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``base`` with a job's own ``experiment_name`` and ``tracking.*`` overrides, typed as
    Hydra types them (``tracking.uri=123`` is an integer)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # Hydra's internals: read on a sweep only

    out = {"experiment_name": base["experiment_name"], "tracking": dict(base["tracking"])}
    for override in OverridesParser.create().parse_overrides(overrides):
        key, value = override.key_or_group, override.value()
        if override.is_delete() or (isinstance(value, str) and "${" in value):
            continue  # the default; or an interpolation, which only the job can resolve (and check)
        if key == "experiment_name":
            out[key] = value
        elif key.startswith("tracking."):
            out["tracking"][key.removeprefix("tracking.")] = value
    return out
