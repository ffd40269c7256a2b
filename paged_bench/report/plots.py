"""PNG plots of a set of runs (matplotlib, Agg: no display needed).

- ``ttft_cdf.png``: the TTFT distribution of each policy, one panel per setting of the other
  dimensions (e.g. one per max_batch);
- ``vs_<axis>.png``: each of the report's metrics against a numeric dimension (throughput and
  TTFT p50/p99 vs max_batch, preemptions, recomputed tokens, ...), a line per policy;
- ``kv_over_time.png``: KV live vs reserved slots over the run, a panel per run, each step's
  figure drawn over the step's own span (a long prefill shows as busy, not idle);
- ``preemptions_over_time.png``: cumulative preemptions over the run, when there are any.

A run without engine steps (a remote target) has no KV or preemption curves.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from paged_bench.report.load import Run, RunSet
from paged_bench.report.tables import figures, metric
from paged_bench.results.step_series import cluster_columns
from paged_bench.run.flat import display_key, display_value

MAX_PANELS = 12


def _pyplot():
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font cache notice is not ours to show

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(plt, n: int, width: float = 4.2, height: float = 3.0):
    cols = min(n, 4 if n > 6 else 3 if n > 2 else n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _save(plt, fig, path: Path) -> Path:
    with warnings.catch_warnings():  # labels too long to lay out tightly: the figure is still drawn whole
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    with warnings.catch_warnings():  # a long run's curves: placing the legend is slow, not wrong
        warnings.filterwarnings("ignore", message='Creating legend with loc="best" can be slow', category=UserWarning)
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _colors(rs: RunSet) -> dict[Any, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {v: cmap(i % 10) for i, v in enumerate(rs.policy_values())}


def _panels(rs: RunSet) -> dict[str, list[Run]]:
    """Runs grouped by the dimensions other than the policy: one panel each."""
    others = [k for k in rs.dims if k != rs.policy]
    panels: dict[str, list[Run]] = {}
    for run in rs.runs:
        panels.setdefault(rs.label(run, others) if others else "", []).append(run)
    return panels


def ttft_cdf(rs: RunSet, out_dir: Path) -> Path | None:
    import numpy as np

    panels = {k: v for k, v in list(_panels(rs).items())[:MAX_PANELS]}
    if not any(r.table("requests") is not None for runs in panels.values() for r in runs):
        return None
    plt = _pyplot()
    colors = _colors(rs)
    fig, axes = _grid(plt, len(panels))
    for ax, (title, runs) in zip(axes, panels.items()):
        for i, run in enumerate(runs):
            df = run.table("requests")
            ttft = np.sort(df["ttft_ms"].dropna().to_numpy()) if df is not None else np.array([])
            if not len(ttft):
                continue
            name = display_value(rs.value(run, rs.policy)) if rs.policy else rs.label(run)
            color = colors.get(rs.value(run, rs.policy)) if rs.policy else None
            # a run that stopped part-way: the requests that got a first token, told apart
            partial = run.status != "finished"
            ax.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post", color=color,
                    label=f"{name} ({run.status})" if partial else name, linestyle="--" if partial else "-")  # fmt: skip
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("share of requests")
        ax.set_title(title or "TTFT CDF")
        ax.grid(alpha=0.3)
        _legend(ax)
    return _save(plt, fig, out_dir / "ttft_cdf.png")


def versus_axis(rs: RunSet, metrics: list[str], out_dir: Path) -> Path | None:
    if not rs.axes:
        return None
    axis = "max_batch" if "max_batch" in rs.axes else rs.axes[0]
    series: dict[str, list[Run]] = {}
    rest = [k for k in rs.dims if k not in (axis, rs.policy)]
    keys = [k for k in (rs.policy, *rest) if k]
    # a run that did not finish measured part of its workload: no point beside those that did;
    # nor can an infinite setting (workload.rate=inf) sit on an axis
    drawn = [r for r in rs.runs if r.status == "finished" and r.summary and math.isfinite(rs.value(r, axis))]
    for run in drawn:
        series.setdefault(rs.label(run, keys) if keys else "runs", []).append(run)
    undrawn = sorted({str(rs.value(r, axis)) for r in rs.runs if not math.isfinite(rs.value(r, axis))})
    metrics = plotted_metrics([r for runs in series.values() for r in runs], metrics)
    if not series or not metrics:
        return None
    plt = _pyplot()
    colors = _colors(rs)
    xs_all = sorted({rs.value(r, axis) for runs in series.values() for r in runs})
    fig, axes = _grid(plt, len(metrics))
    for ax, key in zip(axes, metrics):
        for name, runs in series.items():
            runs = sorted(runs, key=lambda r: rs.value(r, axis))
            color = colors.get(rs.value(runs[0], rs.policy)) if rs.policy and not rest else None
            ax.plot(
                [rs.value(r, axis) for r in runs], [figures(r).get(key) for r in runs], "o-", label=name, color=color
            )
        if len(xs_all) > 2 and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 8:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs_all, [str(x) for x in xs_all])
        ax.set_xlabel(display_key(axis) + (f" ({', '.join(undrawn)}: in the table)" if undrawn else ""))
        ax.set_title(metric(key).label)
        ax.grid(alpha=0.3)
        _legend(ax)
    return _save(plt, fig, out_dir / f"vs_{display_key(axis).replace('.', '_')}.png")


def plotted_metrics(runs: list[Run], metrics: list[str]) -> list[str]:
    """Every metric the report asked for that some run has (one panel each)."""
    return [m for m in metrics if any(figures(r).get(m) is not None for r in runs)]


def _with_steps(rs: RunSet) -> list[Run]:
    return [r for r in rs.runs if r.table("steps") is not None][:MAX_PANELS]


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


def kv_over_time(rs: RunSet, out_dir: Path) -> Path | None:
    runs = _with_steps(rs)
    if not runs:
        return None
    plt = _pyplot()
    fig, axes = _grid(plt, len(runs))
    for ax, run in zip(axes, runs):
        df = _steps(run)
        ax.fill_between(*step_curve(df, "kv_live_slots"), alpha=0.5, label="live")
        ax.plot(*step_curve(df, "kv_reserved_slots"), color="C3", label="reserved")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("KV slots")
        ax.set_title(rs.label(run) if len(rs.runs) > 1 else "KV live vs reserved", fontsize=9)
        ax.grid(alpha=0.3)
        _legend(ax)
    return _save(plt, fig, out_dir / "kv_over_time.png")


def preemptions_over_time(rs: RunSet, out_dir: Path) -> Path | None:
    runs = [r for r in _with_steps(rs) if r.table("steps")["preemptions"].sum() > 0]
    if not runs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        df = _steps(run)
        ax.step(df["time"], df["preemptions"].cumsum(), where="post", label=rs.label(run))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("preemptions (cumulative)")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(plt, fig, out_dir / "preemptions_over_time.png")


def make_plots(rs: RunSet, metrics: list[str], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [
        ttft_cdf(rs, out_dir),
        versus_axis(rs, metrics, out_dir),
        kv_over_time(rs, out_dir),
        preemptions_over_time(rs, out_dir),
    ]
    return [p for p in made if p is not None]
