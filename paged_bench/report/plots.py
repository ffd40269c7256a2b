"""PNG plots of a set of runs; every figure shows every run: drawn, or named in a note under
it (report/canvas.py records which), and panels beyond a page go on further pages
(``kv_over_time_2.png``...).

- ``ttft_cdf.png``: the TTFT distribution of each compared value (a policy, or the
  experiment's ``report.compare``), one panel per setting of the other dimensions, a column of
  them per facet value (``report.facets``), ordered by series then x (report/layout.py);
- ``vs_<axis>.png``: each of the report's metrics against a numeric dimension (the experiment's
  ``report.x``, else max_batch or the first swept number), a line per series (``report.series``,
  else every other setting), a column of panels per facet value (``report.facets``);
- ``kv_over_time.png``: KV live vs reserved slots over the run, a panel per run (a column of
  them per facet value, ordered by series then x), each step's figure drawn over the step's own
  span (a long prefill shows as busy, not idle);
- ``preemptions_over_time.png``: cumulative preemptions over the run of every run, when any
  run preempted: a line per run, a panel per facet value.

A run without engine steps (a remote target) has no KV or preemption curves: the figure names it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from paged_bench.report.canvas import (
    MAX_PANELS,
    Note,
    Plot,
    drop_later_pages,
    grid,
    legends,
    mark,
    page_path,
    page_title,
    pages,
    pyplot,
    save,
    wrap,
    x_ticks,
    y_scale,
)
from paged_bench.report.layout import facet_columns, layout
from paged_bench.report.load import Run, RunSet
from paged_bench.report.tables import figures, metric
from paged_bench.results.step_series import cluster_columns
from paged_bench.run.flat import display_key


def _colors(rs: RunSet) -> dict[Any, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {v: cmap(i % 10) for i, v in enumerate(rs.policy_values())}


def _panels(rs: RunSet, runs: list[Run]) -> dict[str, list[Run]]:
    """Runs grouped by the dimensions other than the policy: one panel each."""
    others = [k for k in rs.dims if k != rs.policy]
    panels: dict[str, list[Run]] = {}
    for run in runs:
        panels.setdefault(rs.label(run, others) if others else "", []).append(run)
    return panels


def _ttfts(run: Run):
    import numpy as np

    df = run.table("requests")
    return np.sort(df["ttft_ms"].dropna().to_numpy()) if df is not None else np.array([])


def ttft_cdf(rs: RunSet, out_dir: Path) -> list[Plot]:
    import numpy as np

    ttfts = {run.source: _ttfts(run) for run in rs.runs}
    with_ttft = [r for r in rs.runs if len(ttfts[r.source])]
    if not with_ttft:
        return []
    without = [r for r in rs.runs if not len(ttfts[r.source])]
    note = Note("no first token to plot (see the table)", without, [rs.label(r) for r in without])
    plt = pyplot()
    colors = _colors(rs)
    made = []
    panels = _panels(rs, with_ttft)
    panel_pages = layout(rs, list(panels), lambda title: panels[title][0])
    for index, page in enumerate(panel_pages.pages):
        fig, axes = grid(plt, len(page), cols=panel_pages.cols)
        for ax, title in zip(axes, page):
            if title is None:  # a facet value with fewer panels than another
                ax.set_visible(False)
                continue
            runs = panels[title]
            for run in runs:
                ttft = ttfts[run.source]
                name = rs.policy_label(rs.value(run, rs.policy)) if rs.policy else rs.label(run)
                color = colors.get(rs.value(run, rs.policy)) if rs.policy else None
                # a run that stopped part-way: the requests that got a first token, told apart
                partial = run.status != "finished"
                mark(ax.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post", color=color,
                             label=f"{name} ({run.status})" if partial else name,
                             linestyle="--" if partial else "-"), [run])  # fmt: skip
            ax.set_xscale("symlog", linthresh=10)
            ax.set_xlabel("TTFT (ms)")
            ax.set_ylabel("share of requests")
            ax.set_title(wrap(title) if title else "TTFT CDF", fontsize=9)
            ax.grid(alpha=0.3)
        legends(fig, axes)
        if len(panel_pages.pages) > 1:
            fig.suptitle(f"TTFT CDF: page {index + 1} of {len(panel_pages.pages)}", fontsize=11)
        made.append(save(plt, fig, page_path(out_dir, "ttft_cdf", index), [note] if index == 0 else []))
    drop_later_pages(out_dir, "ttft_cdf", len(made))
    return made


def _x_axis(rs: RunSet) -> str:
    return rs.question.x or ("max_batch" if "max_batch" in rs.axes else rs.axes[0])


def _series_keys(rs: RunSet, axis: str, facets: list[str]) -> list[str]:
    """What tells the lines apart: the declared series, then every other setting that varies
    (two runs never share a point); undeclared, the policy first."""
    if rs.question.declared:
        first = list(rs.question.series)
    else:
        first = [rs.policy] if rs.policy and rs.policy != axis else []
    return first + [k for k in rs.dims if k not in (axis, *facets, *first)]


def versus_axis(rs: RunSet, metrics: list[str], out_dir: Path) -> list[Plot]:
    if not rs.axes:
        return []
    axis = _x_axis(rs)
    facets = list(rs.question.facets)
    keys = _series_keys(rs, axis, facets)
    # a run that did not finish measured part of its workload: no point beside those that did;
    # nor can an infinite setting (workload.rate=inf) sit on an axis. Both are named under it
    drawn = [r for r in rs.runs if r.status == "finished" and r.summary and math.isfinite(rs.value(r, axis))]
    metrics = plotted_metrics(drawn, metrics)
    if not drawn or not metrics:
        return []
    unfinished = [r for r in rs.runs if r.status != "finished" or not r.summary]
    infinite = [r for r in rs.runs if r not in unfinished and r not in drawn]
    notes = [Note("not finished (their status is in the table)", unfinished, [rs.label(r) for r in unfinished]),
             Note(f"{display_key(axis)} off the axis (in the table)", infinite, [rs.label(r) for r in infinite])]  # fmt: skip
    by_facet: dict[str, dict[str, list[Run]]] = {}
    for run in drawn:
        line = rs.label(run, keys) if keys else ""
        by_facet.setdefault(rs.label(run, facets) if facets else "", {}).setdefault(line, []).append(run)
    plt = pyplot()
    colors = _colors(rs)
    xs_all = sorted({rs.value(r, axis) for r in drawn})
    cols = len(by_facet) if facets else None
    made = []
    metric_pages = pages(metrics, max(1, MAX_PANELS // len(by_facet)))
    stem = f"vs_{display_key(axis).replace('.', '_')}"
    for index, page in enumerate(metric_pages):
        fig, axes = grid(plt, len(page) * len(by_facet), cols=cols)
        cells = [(key, facet, series) for key in page for facet, series in by_facet.items()]
        for ax, (key, facet, series) in zip(axes, cells):
            ys = []
            for name, runs in series.items():
                runs = sorted(runs, key=lambda r: rs.value(r, axis))
                color = colors.get(rs.value(runs[0], rs.policy)) if keys == [rs.policy] else None
                values = [figures(r).get(key) for r in runs]
                ys += values
                # one line with nothing to tell it apart from others: no legend
                label = name if keys else None
                mark(ax.plot([rs.value(r, axis) for r in runs], values, "o-", label=label, color=color), runs)
            x_ticks(ax, xs_all)
            y_scale(ax, ys)
            ax.set_xlabel(display_key(axis))
            ax.set_title(metric(key).label + (f"\n{wrap(facet)}" if facet else ""), fontsize=10)
            ax.grid(alpha=0.3)
        legends(fig, axes)
        made.append(save(plt, fig, page_path(out_dir, stem, index), notes))
    drop_later_pages(out_dir, stem, len(made))
    return made


def plotted_metrics(runs: list[Run], metrics: list[str]) -> list[str]:
    """Every metric the report asked for that some run has (one panel each)."""
    return [m for m in metrics if any(figures(r).get(m) is not None for r in runs)]


def _with_steps(rs: RunSet) -> list[Run]:
    return [r for r in rs.runs if r.table("steps") is not None]


def _no_steps(rs: RunSet, runs: list[Run]) -> Note:
    missing = [r for r in rs.runs if r not in runs]
    return Note(
        "no engine steps to draw (a remote target's run, or no steps.csv)", missing, [rs.label(r) for r in missing]
    )


def _steps(run: Run):
    """The run's steps as one series: a cluster's replicas summed (``cluster_columns``; drawn
    row by row, they made a sawtooth that jumped between replicas)."""
    import pandas as pd

    df = run.table("steps")
    return pd.DataFrame(cluster_columns(df["replica"].to_numpy(), df)) if "replica" in df else df


def step_curve(steps, column: str):
    """A per-step figure as a line over time: each step's value held over its own span
    [end - duration, end] (a step row's ``time`` is its end), across the gap to the next step
    while requests are still running, and 0 through the engine's idle gaps (nothing running).
    Returns (x, y) arrays."""
    import numpy as np

    end = steps["time"].to_numpy(float)
    start = end - steps["duration"].to_numpy(float)
    value = steps[column].to_numpy(float)
    idle_after = steps["running"].to_numpy() == 0 if "running" in steps else np.zeros(len(end), bool)
    after = np.where(idle_after, 0.0, value)  # the value between this step and the next
    next_start = np.append(start[1:], end[-1:])
    x = np.column_stack([start, end, end, next_start]).ravel()
    y = np.column_stack([value, value, after, after]).ravel()
    return x, y


def kv_over_time(rs: RunSet, out_dir: Path) -> list[Plot]:
    runs = _with_steps(rs)
    if not runs:
        return []
    plt = pyplot()
    made, first = [], 1
    laid = layout(rs, runs, lambda run: run)
    for index, cells in enumerate(laid.pages):
        fig, axes = grid(plt, len(cells), cols=laid.cols)
        page = [run for run in cells if run is not None]
        for ax, run in zip(axes, cells):
            if run is None:  # a facet value with fewer runs than another
                ax.set_visible(False)
                continue
            df = _steps(run)
            mark(ax.fill_between(*step_curve(df, "kv_live_slots"), alpha=0.5, label="live"), [run])
            mark(ax.plot(*step_curve(df, "kv_reserved_slots"), color="C3", label="reserved"), [run])
            ax.set_xlabel("time (s)")
            ax.set_ylabel("KV slots")
            ax.set_title(wrap(rs.label(run)) if len(rs.runs) > 1 else "KV live vs reserved", fontsize=9)
            ax.grid(alpha=0.3)
        legends(fig, axes)
        page_title(fig, "KV live vs reserved", index, len(laid.pages), first, first + len(page) - 1, len(runs))
        first += len(page)
        notes = [_no_steps(rs, runs)] if index == 0 else []
        made.append(save(plt, fig, page_path(out_dir, "kv_over_time", index), notes))
    drop_later_pages(out_dir, "kv_over_time", len(made))
    return made


def preemptions_over_time(rs: RunSet, out_dir: Path) -> list[Plot]:
    """Every run's cumulative preemptions (those with none are flat at 0), when any run preempted:
    a panel per facet value (one when none is declared), a line per run named by the rest."""
    runs = _with_steps(rs)
    if not any(r.table("steps")["preemptions"].sum() > 0 for r in runs):
        return []
    plt = pyplot()
    panels = facet_columns(rs, runs, lambda run: run)
    fig, axes = grid(plt, len(panels), width=7 if len(panels) == 1 else 4.2, height=4 if len(panels) == 1 else 3.0)
    rest = [k for k in rs.dims if k not in rs.question.facets]
    for ax, (facet, column) in zip(axes, panels.items()):
        for run in column:
            df = _steps(run)
            mark(ax.step(df["time"], df["preemptions"].cumsum(), where="post", label=rs.label(run, rest)), [run])
        ax.set_xlabel("time (s)")
        ax.set_ylabel("preemptions (cumulative)")
        if facet:
            ax.set_title(wrap(facet), fontsize=9)
        ax.grid(alpha=0.3)
    legends(fig, axes)
    return [save(plt, fig, out_dir / "preemptions_over_time.png", [_no_steps(rs, runs)])]


def make_plots(rs: RunSet, metrics: list[str], out_dir: Path) -> list[Plot]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        *ttft_cdf(rs, out_dir),
        *versus_axis(rs, metrics, out_dir),
        *kv_over_time(rs, out_dir),
        *preemptions_over_time(rs, out_dir),
    ]
