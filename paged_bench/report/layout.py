"""Where a figure's panels go, as the experiment's question declares it (report/axes.py): a
column of panels per value of ``report.facets``, each column's panels in the order of
``report.series`` (their values in sweep order), then ``report.x`` (ascending), so that a row
holds like beside like; pages of whole rows, none dropped. An experiment that declares nothing
keeps the panels in sweep order and the grid its own number of columns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from paged_bench.report.canvas import MAX_PANELS, pages
from paged_bench.report.load import Run, RunSet

T = TypeVar("T")


@dataclass(frozen=True)
class Layout(Generic[T]):
    """A figure's panels, page by page: each page's cells row by row (None: an empty cell, where
    one facet value has fewer panels than another), and the columns (None: the grid's choice)."""

    pages: list[list[T | None]]
    cols: int | None


def run_order(rs: RunSet) -> Callable[[Run], tuple[Any, ...]]:
    """A sort key: the declared series' values in the order the sweep met them, then x's value."""
    series = list(rs.question.series)
    seen: dict[str, list[Any]] = {key: [] for key in series}
    for run in rs.runs:
        for key in series:
            if (value := rs.value(run, key)) not in seen[key]:
                seen[key].append(value)
    x = rs.question.x

    def key(run: Run) -> tuple[Any, ...]:
        ranks = tuple(seen[k].index(rs.value(run, k)) for k in series)
        return (*ranks, rs.value(run, x)) if x else ranks

    return key


def facet_columns(rs: RunSet, items: Sequence[T], run_of: Callable[[T], Run]) -> dict[str, list[T]]:
    """``items`` by the label of their run's declared facets ({"": all} when none are declared),
    each column in ``run_order`` when the experiment declares its axes."""
    facets = list(rs.question.facets)
    columns: dict[str, list[T]] = {}
    for item in items:
        columns.setdefault(rs.label(run_of(item), facets) if facets else "", []).append(item)
    if rs.question.declared:
        order = run_order(rs)
        columns = {label: sorted(column, key=lambda item: order(run_of(item))) for label, column in columns.items()}
    return columns


def layout(rs: RunSet, items: Sequence[T], run_of: Callable[[T], Run]) -> Layout[T]:
    """``items`` (a panel each) laid out a column per facet value, in pages of whole rows."""
    columns = facet_columns(rs, items, run_of)
    if not columns:
        return Layout([], None)
    if not rs.question.facets:
        return Layout(pages(columns[""]), None)
    depth = max(len(column) for column in columns.values())
    rows = [[column[i] if i < len(column) else None for column in columns.values()] for i in range(depth)]
    per_page = max(1, MAX_PANELS // len(columns))
    return Layout([[cell for row in page for cell in row] for page in pages(rows, per_page)], len(columns))
