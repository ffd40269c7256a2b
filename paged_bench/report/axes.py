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
over; one that is no setting of the runs (a typo) is a note, not an error: the runs are done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

AXIS_KEYS = ("x", "series", "facets", "compare")


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


def resolve(
    section: Mapping[str, Any], settings: set[str], dims: list[str], numeric: list[str]
) -> tuple[Question, list[str]]:
    """The ``report`` section's axes, kept where the runs vary them. ``settings``: every flat
    config key the runs have; ``dims``: those that vary; ``numeric``: the varying numbers.
    Returns the question and the notes to print (one line each)."""
    notes: list[str] = []
    chosen: dict[str, list[str]] = {}
    for key in AXIS_KEYS:
        names = _names(key, section.get(key), notes)
        if len(names) > 1 and key in ("x", "compare"):
            notes.append(f"report.{key}={names!r} is not allowed: one setting; the report chose its own")
            names = []
        # a config group names its plugin's setting: ``compare: scheduler`` is ``scheduler.name``
        names = [f"{n}.name" if n not in settings and f"{n}.name" in settings else n for n in names]
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
