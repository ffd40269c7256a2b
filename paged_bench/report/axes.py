"""The axes of an experiment's question, as its YAML declares them under ``report``
(conf/experiment/*.yaml), and how a report reads them:

Each names a setting as the sweep does (``backend.tensor_parallel_size``; a config group, such
as ``scheduler``, its plugin's choice):

- ``x``: the numeric setting on the x axis of the versus plot (``vs_<x>.png``);
- ``series``: a setting, or a list of them, drawn as a line each in that plot;
- ``facets``: a setting, or a list, that gets a column of panels per value in that plot;
- ``compare``: the setting whose values the table puts side by side, with each one's gain over
  the first (the baseline), and whose values are the TTFT CDF's lines.

A setting the declaration leaves out that still varies is added to the series (no two runs
ever share a point). An experiment that declares nothing gets the report's own choice
(``RunSet.of``: the first plugin choice compared, the first numeric setting on the x axis). A
declared setting that the runs do not vary (a sweep narrowed on the command line) is passed
over. A name that is no setting (a typo) is refused as the config is read (``check_declared``,
from ``BenchConfig.from_config``: a run's, or a sweep's before its first job); in runs already
made (an older config, a run fetched from MLflow) it is a note, not an error: the runs are done.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from paged_bench.errors import ConfigError
from paged_bench.run.flat import flatten

AXIS_KEYS = ("x", "series", "facets", "compare")
SINGLE = ("x", "compare")  # one setting each; series and facets take a list too


@dataclass(frozen=True)
class Question:
    """The declared axes, each resolved against what the runs vary (empty where undeclared)."""

    x: str | None = None
    series: tuple[str, ...] = ()
    facets: tuple[str, ...] = ()
    compare: str | None = None

    @property
    def declared(self) -> bool:
        return bool(self.x or self.series or self.facets or self.compare)


def declared_section(configs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The first run's ``report`` section that declares any axis ({} when none does)."""
    for config in configs:
        section = config.get("report") or {}
        if isinstance(section, Mapping) and any(section.get(k) for k in AXIS_KEYS):
            return dict(section)
    return {}


def _names(key: str, value: Any, notes: list[str]) -> list[str]:
    """A declared value as a list of setting names; anything else is a note and no names."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return list(value)
    notes.append(f"report.{key}={value!r} is not allowed: a setting's dotted name, or a list of them for series "
                 "and facets; the report chose its own")  # fmt: skip
    return []


def _setting(name: str, settings: Collection[str]) -> str:
    """A config group names its plugin's setting: ``compare: scheduler`` is ``scheduler.name``."""
    return f"{name}.name" if name not in settings and f"{name}.name" in settings else name


def _allowed(name: str, settings: Collection[str]) -> str:
    """What a mistyped ``name`` could have been: the nearest setting, then the settings of the
    section it names (``backend.``'s), else the config's top-level ones."""
    near = difflib.get_close_matches(name, settings, n=1)
    if not near:  # a section left out or misnamed: the nearest by the setting's own name
        last = {k.rsplit(".", 1)[-1]: k for k in sorted(settings, key=lambda k: (k.count("."), k), reverse=True)}
        near = [last[m] for m in difflib.get_close_matches(name.rsplit(".", 1)[-1], last, n=1)]
    hint = f" (did you mean {near[0]}?)" if near else ""
    section = name.split(".", 1)[0]
    inside = sorted(k for k in settings if k.startswith(section + "."))
    listed = inside or sorted({k.split(".", 1)[0] for k in settings})
    return (f"a setting of the run's config by its dotted name{hint}; "
            f"{f'the {section} section has' if inside else 'its top-level settings are'} {', '.join(listed)}")  # fmt: skip


def check_declared(section: Any, config: Mapping[str, Any]) -> None:
    """The axes a run's ``report`` section declares, each a setting of ``config`` (a group's name
    standing for its plugin's): ConfigError, one line, for the first that is not."""
    if not isinstance(section, Mapping):
        return
    settings = set(flatten(config))
    for key in AXIS_KEYS:
        value = section.get(key)
        notes: list[str] = []
        names = _names(key, value, notes)
        if notes or (key in SINGLE and len(names) > 1):
            shape = "one setting's dotted name" if key in SINGLE else "a setting's dotted name, or a list of them"
            raise ConfigError(f"report.{key}", value, shape)
        for name in names:
            if _setting(name, settings) not in settings:
                raise ConfigError(f"report.{key}", name, _allowed(name, settings))


def resolve(
    section: Mapping[str, Any], settings: Collection[str], dims: list[str], numeric: list[str]
) -> tuple[Question, list[str]]:
    """The ``report`` section's axes, kept where the runs vary them. ``settings``: every flat
    config key the runs have; ``dims``: those that vary; ``numeric``: the varying numbers.
    Returns the question and the notes to print (one line each)."""
    notes: list[str] = []
    chosen: dict[str, list[str]] = {}
    for key in AXIS_KEYS:
        names = _names(key, section.get(key), notes)
        if len(names) > 1 and key in SINGLE:
            notes.append(f"report.{key}={names!r} is not allowed: one setting; the report chose its own")
            names = []
        names = [_setting(n, settings) for n in names]
        unknown = [n for n in names if n not in settings]
        if unknown:
            notes.append(f"report.{key} names {', '.join(unknown)}, which no run has as a setting; settings that "
                         f"vary: {', '.join(dims) or 'none'}")  # fmt: skip
        chosen[key] = [n for n in names if n in dims]
    if chosen["x"] and chosen["x"][0] not in numeric:
        notes.append(f"report.x={chosen['x'][0]} is not allowed: the x axis takes a numeric setting "
                     f"({', '.join(numeric) or 'none varies'})")  # fmt: skip
        chosen["x"] = []
    x = chosen["x"][0] if chosen["x"] else None
    facets = tuple(f for f in chosen["facets"] if f != x)
    series = tuple(s for s in chosen["series"] if s != x and s not in facets)
    compare = chosen["compare"][0] if chosen["compare"] else None
    return Question(x, series, facets, compare), notes
