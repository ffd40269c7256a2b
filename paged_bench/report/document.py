"""A report of a set of runs: ``table.csv`` (every run, every figure), ``table.md``,
the plots, and ``report.md`` that ties them together (the README's results come from it)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from paged_bench.report.canvas import Plot
from paged_bench.report.load import Run, RunSet, load_run
from paged_bench.report.plots import make_plots
from paged_bench.report.tables import (
    DEFAULT_METRICS,
    METRICS,
    comparison_frame,
    comparison_markdown,
    figures,
    head_to_head_markdown,
)


@dataclass
class Report:
    out_dir: Path
    table: str  # the comparison table alone, markdown
    files: list[Path] = field(default_factory=list)
    num_failed: int = 0
    pictures: list[Path] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)  # the markdown before the pictures
    num_runs: int = 0
    plots: list[Plot] = field(default_factory=list)  # each figure and the runs it shows

    def markdown_at(self, base: Path) -> str:
        """The report as markdown whose links work from a file in folder ``base``."""

        def link(path: Path) -> str:
            return Path(os.path.relpath(path, base)).as_posix()

        parts = [*self.sections, *(f"![{p.stem.replace('_', ' ')}]({link(p)})" for p in self.pictures)]
        parts.append(
            f"_{self.num_runs} run(s); every figure of every run: [table.csv]({link(self.out_dir / 'table.csv')})_"
        )
        return "\n\n".join(parts) + "\n"

    @property
    def markdown(self) -> str:
        return self.markdown_at(self.out_dir)


def build_report(
    runs: list[Run],
    out_dir: Path,
    *,
    title: str | None = None,
    description: str | None = None,
    metrics: list[str] | None = None,
    plots: bool = True,
) -> Report:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rs = RunSet.of(runs)
    if metrics is None and (metrics := rs.report_metrics()) and (unknown := unknown_metrics(metrics, runs)):
        # the config's list (report.metrics): the runs are done, so a typo is said, not fatal
        print(f"note: report.metrics names {', '.join(unknown)}, which none of these runs has (a column of n/a); "
              f"summary keys such as {', '.join(list(METRICS)[:4])}, ...", file=sys.stderr)  # fmt: skip
    for note in rs.notes:  # the experiment's declared axes (report.x ...): the runs are done, a note
        print(f"note: {note}", file=sys.stderr)
    metrics = metrics or default_metrics(runs)
    title = title or rs.experiment_name() or out_dir.parent.name

    files = [out_dir / "table.csv", out_dir / "table.md"]
    comparison_frame(rs).to_csv(files[0], index=False)
    table = comparison_markdown(rs, metrics)
    files[1].write_text(table + "\n")
    drawn = make_plots(rs, metrics, out_dir) if plots else []
    pictures = [plot.path for plot in drawn]

    failed = [r for r in runs if r.status != "finished"]
    parts = [f"### {title}"]
    if description:
        parts.append(description)
    if common := common_overrides(runs):  # what the table, showing what varies, leaves out
        parts.append(f"Every run: `{' '.join(common)}`")
    head_to_head = head_to_head_markdown(rs, metrics)
    if head_to_head:  # says it all; every run's own row is in table.md and table.csv
        parts.append(head_to_head)
    else:
        parts.append(table)
    if failed:
        parts.append(
            "Runs that did not finish:\n" + "\n".join(f"- {rs.label(r)}: {_outcome(r)}" for r in failed)
        )
    files.append(out_dir / "report.md")
    report = Report(
        out_dir.resolve(), table, files + pictures, len(failed), [p.resolve() for p in pictures], parts, len(runs), drawn
    )
    files[-1].write_text(report.markdown)
    return report


def unknown_metrics(metrics: list[str], runs: list[Run]) -> list[str]:
    """The names in ``metrics`` that are neither a figure the report knows nor one of the runs'."""
    known = set(METRICS).union(*(figures(r) for r in runs))
    return [m for m in metrics if m not in known]


def default_metrics(runs: list[Run]) -> list[str]:
    """``DEFAULT_METRICS``; where any run is a cluster, the KV peak of all replicas at once in
    place of the largest one replica reached (which fell in a sweep over ``cluster.replicas``;
    a single engine's is its own, ``derived_figures``); goodput where any run was given an SLO."""
    metrics = list(DEFAULT_METRICS)
    if any("cluster_kv_reserved_slots_peak" in run.summary for run in runs):
        metrics = [m.replace("kv_reserved_slots_peak", "cluster_kv_reserved_slots_peak") for m in metrics]
    if any(run.summary.get("goodput") is not None for run in runs):
        metrics.insert(metrics.index("output_throughput") + 1, "goodput")
    return metrics


def common_overrides(runs: list[Run]) -> list[str]:
    """The command-line overrides every run was given (``+experiment=X max_batch=8``: a sweep's
    fixed settings), as each run's ``run_info.json`` records them (store and Hydra settings
    left out); none where a run has no such record."""
    if not runs or any(run.overrides is None for run in runs):
        return []
    return [str(o) for o in runs[0].overrides if all(o in run.overrides for run in runs[1:])]


def _outcome(run: Run) -> str:
    """``failed: <error>``; an interrupted run's error only repeats its status."""
    return run.status if run.error in (None, run.status) else f"{run.status}: {run.error}"


def run_plots(run_dir: Path) -> list[Path]:
    """One run's plots in ``<run>/plots``: KV over time, TTFT CDF, preemptions (if any)."""
    return [plot.path for plot in make_plots(RunSet.of([load_run(run_dir)]), [], run_dir / "plots")]
