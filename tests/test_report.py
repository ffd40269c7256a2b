"""Reports: runs and sweeps on disk -> the comparison table (CSV + markdown), the head-to-head
view with each policy's gain over the baseline, and the PNG plots; from the figures the runs
wrote, never typed in."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from paged_bench.report.__main__ import main as report_main
from paged_bench.report.axes import Question, resolve
from paged_bench.report.document import build_report, run_plots
from paged_bench.report.load import RunSet, find_runs, save_config
from paged_bench.report.plots import plotted_metrics, step_curve
from paged_bench.report.tables import gain, metric
from paged_bench.run.job import run_job
from tests.conftest import compose_config

EXPERIMENTS = Path(__file__).parents[1] / "paged_bench" / "conf" / "experiment"

PNG = b"\x89PNG\r\n\x1a\n"


def make_sweep(root: Path, jobs: list[list[str]], extra: tuple[str, ...] = ()) -> Path:
    """A sweep folder as the CLI leaves it: one run folder per job, named by its number."""
    for num, overrides in enumerate(jobs):
        run_dir = root / str(num)
        config = compose_config(*overrides, *extra)
        save_config(run_dir, config)
        run_job(config, run_dir)
    return root


def batching_sweep(root: Path) -> Path:
    jobs = [[f"scheduler={s}", f"max_batch={b}"] for s in ("static", "continuous") for b in (4, 16)]
    return make_sweep(root, jobs, ("workload.num_requests=24",))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return batching_sweep(tmp_path_factory.mktemp("sweep"))


def test_the_runs_and_what_varies_between_them(sweep):
    runs = find_runs(sweep)
    assert [r.job for r in runs] == [0, 1, 2, 3] and all(r.status == "finished" for r in runs)
    rs = RunSet.of(runs)
    assert rs.dims == ["scheduler.name", "max_batch"]  # max_batch, not its twin scheduler.max_batch
    assert rs.policy == "scheduler.name" and rs.axes == ["max_batch"]
    assert rs.policy_values() == ["static", "continuous"]  # sweep order: static is the baseline
    assert rs.label(runs[1]) == "scheduler=static max_batch=16"


def test_the_report_tables_hold_the_runs_own_figures(sweep, tmp_path):
    (tmp_path / "kv_over_time_2.png").write_bytes(PNG)  # an earlier report's second page: 4 runs need one
    rep = build_report(find_runs(sweep), tmp_path, title="batching")
    assert not (tmp_path / "kv_over_time_2.png").exists()
    summaries = [json.loads((sweep / str(j) / "summary.json").read_text()) for j in range(4)]
    table = pd.read_csv(tmp_path / "table.csv")
    assert list(table["scheduler"]) == ["static", "static", "continuous", "continuous"]
    assert list(table["max_batch"]) == [4, 16, 4, 16]
    assert table["median_ttft_ms"].tolist() == pytest.approx([s["median_ttft_ms"] for s in summaries])
    assert table["output_throughput"].tolist() == pytest.approx([s["output_throughput"] for s in summaries])

    # head to head: static and continuous side by side per max_batch, with continuous's gain
    row = next(l for l in rep.markdown.splitlines() if l.startswith("|        16 | TTFT p50"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    static, continuous = summaries[1]["median_ttft_ms"], summaries[3]["median_ttft_ms"]  # jobs 1 and 3: max_batch 16
    assert cells[2:] == [f"{static:,.0f}", f"{continuous:,.0f}", gain(metric("median_ttft_ms"), static, continuous)]
    assert rep.markdown.startswith("### batching") and "| continuous vs static |" in rep.markdown
    assert (tmp_path / "report.md").read_text() == rep.markdown
    for name in ("ttft_cdf.png", "vs_max_batch.png", "kv_over_time.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG and f"]({name})" in rep.markdown
    assert not (tmp_path / "preemptions_over_time.png").exists()  # nothing was preempted


def test_gains_point_the_right_way():
    assert gain(metric("median_ttft_ms"), 1000.0, 100.0) == "10.0x"  # lower is better: 10x better
    assert gain(metric("output_throughput"), 400.0, 600.0) == "1.50x"  # higher is better
    assert gain(metric("median_ttft_ms"), 100.0, None) == "n/a" and gain(metric("num_preemptions"), 0, 0) == "n/a"
    assert gain(metric("num_preemptions"), 0, 4) == "n/a" and gain(metric("recomputed_tokens"), 12, 0) == "n/a"


@pytest.mark.parametrize("experiment", sorted(p.stem for p in EXPERIMENTS.glob("*.yaml")))
def test_every_figure_an_experiment_reports_has_a_column_header(experiment):
    # the routing and disaggregation tables showed replica_load_imbalance, kv_transfer_bytes as headers
    metrics = (yaml.safe_load((EXPERIMENTS / f"{experiment}.yaml").read_text()).get("report") or {}).get("metrics")
    assert all(metric(key).label != key for key in metrics or ()), metrics


def test_preemptions_are_plotted_when_there_are_any(tmp_path):
    jobs = [[f"scheduler.mode={m}", f"num_blocks={n}"] for m in ("recompute", "swap") for n in (40, 64)]
    sweep = make_sweep(tmp_path / "sweep", jobs, ("scheduler=preemptive", "max_batch=32"))
    metrics = ["output_throughput", "median_ttft_ms", "p99_e2el_ms", "num_preemptions", "recomputed_tokens",
               "swapped_blocks"]  # pool_exhaustion's report.metrics
    rep = build_report(find_runs(sweep), tmp_path / "out", metrics=metrics)
    assert (tmp_path / "out" / "preemptions_over_time.png").read_bytes()[:8] == PNG
    assert (tmp_path / "out" / "vs_num_blocks.png").read_bytes()[:8] == PNG
    assert plotted_metrics(find_runs(sweep), metrics) == metrics  # a panel for each, none dropped
    assert "recompute" in rep.markdown and "swap vs recompute" in rep.markdown
    assert "0.00x" not in rep.markdown  # recompute swaps no blocks: no ratio to tell


def test_kv_over_time_shows_no_idle_gap_during_busy_steps(tmp_path):
    """Each step's KV figures are drawn over its own span: a long prefill (static batching
    seats max_batch prompts at once) is busy, not the previous step's empty pool."""
    run_dir = make_sweep(tmp_path / "runs", [["scheduler=static", "max_batch=32"]]) / "0"
    steps = pd.read_csv(run_dir / "steps.csv")
    busy = steps[steps["batch_size"] > 0]
    middle = (busy["time"] - busy["duration"] / 2).to_numpy()
    for column in ("kv_live_slots", "kv_reserved_slots"):
        x, y = step_curve(steps, column)
        assert np.all(np.diff(x) >= 0)  # a line over time, never backwards
        drawn = np.interp(middle, x, y)
        assert np.array_equal(drawn, busy[column].to_numpy(float)), column
    # the case the old drawing got wrong: a step that starts from an empty pool (after idling)
    long_steps = busy[(busy["duration"] > busy["duration"].median() * 5) & (busy["kv_reserved_slots"] > 0)]
    assert len(long_steps)
    assert (run_dir / "plots").exists() is False and run_plots(run_dir)


def test_failed_runs_are_listed_not_dropped(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [["max_batch=8"]])
    failed = tmp_path / "sweep" / "1"
    save_config(failed, {**compose_config("max_batch=8"), "max_batch": -1})
    (failed / "run_info.json").write_text(json.dumps({"status": "failed", "error": "max_batch=-1 is not allowed"}))
    rep = build_report(find_runs(sweep), tmp_path / "out")
    assert rep.num_failed == 1
    assert "- max_batch=-1: failed: max_batch=-1 is not allowed" in rep.markdown
    assert "| failed" in rep.table


def test_a_single_run_gets_its_figures_and_plots(tmp_path):
    run_dir = make_sweep(tmp_path / "runs", [["max_batch=8"]]) / "0"
    plots = run_plots(run_dir)
    assert {p.name for p in plots} == {"ttft_cdf.png", "kv_over_time.png"}
    rep = build_report(find_runs(run_dir), tmp_path / "out", metrics=["completed", "median_ttft_ms"])
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = {
        cells[0]: cells[1] for cells in ([c.strip() for c in l.strip("|").split("|")] for l in rep.table.splitlines())
    }
    assert rows["TTFT p50 (ms)"] == f"{summary['median_ttft_ms']:,.0f}" and rows["completed"] == str(
        summary["completed"]
    )
    assert "status" not in rows
    # interrupted: its figures read as a finished run's, with nothing beside them to say otherwise
    (run_dir / "run_info.json").write_text(json.dumps({"status": "interrupted", "error": "interrupted"}))
    rep = build_report(find_runs(run_dir), tmp_path / "out2", metrics=["completed"], plots=False)
    first = [c.strip() for c in rep.table.splitlines()[2].strip("|").split("|")]
    assert first == ["status", "interrupted: the figures below are of the part it ran"]


def test_a_run_that_stopped_part_way_is_a_dashed_curve_named_by_its_status(tmp_path, monkeypatch):
    from paged_bench.report import canvas, plots

    sweep = make_sweep(tmp_path / "sweep", [["scheduler=static"], ["scheduler=continuous"]])
    (sweep / "0" / "run_info.json").write_text(json.dumps({"status": "interrupted", "error": "interrupted"}))
    drawn = []
    monkeypatch.setattr(canvas, "write_png", lambda fig, path: drawn.append(fig))
    plots.ttft_cdf(RunSet.of(find_runs(sweep)), tmp_path)
    lines = {line.get_label(): line.get_linestyle() for line in drawn[0].axes[0].get_lines()}
    assert lines == {"static (interrupted)": "--", "continuous": "-"}


def test_the_command_writes_next_to_the_sweep_and_prints_the_markdown(sweep, capsys):
    assert report_main([str(sweep), "--metrics", "output_throughput,p99_ttft_ms", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "output throughput (tok/s)" in out and "TTFT p99 (ms)" in out and "TTFT p50" not in out
    assert (sweep / "report" / "table.md").is_file() and (sweep / "report" / "report.md").read_text() == out.rstrip(
        "\n"
    ) + "\n"


def test_the_command_says_when_there_is_nothing_to_report(tmp_path, capsys):
    assert report_main([str(tmp_path)]) == 1
    assert "no runs found" in capsys.readouterr().err


def test_the_markdown_file_links_to_the_plots_from_where_it_is(sweep, tmp_path, capsys):
    md = tmp_path / "docs" / "results.md"
    assert report_main([str(sweep), "--out", str(tmp_path / "docs" / "results" / "batching"), "--md", str(md)]) == 0
    text = md.read_text()
    assert text == capsys.readouterr().out.rstrip("\n") + "\n"
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert "results/batching/vs_max_batch.png" in links and "results/batching/table.csv" in links
    assert all((md.parent / link).is_file() for link in links)


def test_into_rewrites_only_the_marked_section_of_a_file(sweep, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\n<!-- report:start -->\nold table\n<!-- report:end -->\n\nAfter.\n")
    assert report_main([str(sweep), "--out", str(tmp_path / "docs" / "results"), "--into", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\n\n<!-- report:start -->\n### ") and text.endswith("<!-- report:end -->\n\nAfter.\n")
    assert "old table" not in text
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links and all((tmp_path / link).is_file() for link in links)
    unmarked = tmp_path / "plain.md"
    unmarked.write_text("no markers\n")
    assert report_main([str(sweep), "--no-plots", "--into", str(unmarked)]) == 1
    assert "no <!-- report:start -->" in capsys.readouterr().err and unmarked.read_text() == "no markers\n"


@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_store_that_is_down_is_one_line_in_seconds(tmp_path, capsys, monkeypatch, given):
    """As sync says it (``error: sync failed: ...``): no traceback, a non-zero exit."""
    import time

    from tests.tracking_support import free_port

    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    args = ["--experiment", "sched", "--out", str(tmp_path)]
    if given == "option":
        args += ["--tracking-uri", uri]
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    started = time.monotonic()
    assert report_main(args) == 1
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert err.startswith("error: report failed: MlflowException: API request to") and err.count("\n") == 1, err
    assert "Connection refused" in err  # why, kept where a long message is shortened


def test_a_folder_as_the_store_is_refused_in_one_line(tmp_path, capsys):
    assert report_main(["--experiment", "sched", "--tracking-uri", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --tracking-uri='{tmp_path}' is not allowed: a tracking URI")


def test_declared_axes_are_read_as_the_sweep_names_them_and_a_typo_is_a_note():
    settings = {"scheduler.name", "max_batch", "workload.rate", "backend.model"}
    dims, numeric = ["scheduler.name", "max_batch", "workload.rate"], ["max_batch", "workload.rate"]
    section = {"x": "workload.rate", "series": ["scheduler", "backend.model"], "facets": "max_batch",
               "compare": "scheduler"}  # fmt: skip
    # a group is its plugin's choice; a setting the runs do not vary (backend.model) is passed over
    assert resolve(section, settings, dims, numeric) == (Question("workload.rate", ("scheduler.name",),
                                                                  ("max_batch",), "scheduler.name"), [])  # fmt: skip
    question, notes = resolve({"x": "max_bach", "compare": ["a", "b"], "series": 3}, settings, dims, numeric)
    assert question == Question() and len(notes) == 3
    assert "report.x names max_bach, which no run has as a setting; settings that vary: scheduler.name" in notes[0]
    assert notes[1].startswith("report.series=3 is not allowed") and "one setting" in notes[2]
    _, notes = resolve({"x": "scheduler"}, settings, dims, numeric)
    assert notes == ["report.x=scheduler.name is not allowed: the x axis takes a numeric setting (max_batch, workload.rate)"]


def test_a_mistyped_axis_still_gets_its_report_and_one_line_saying_so(sweep, tmp_path, capsys):
    runs = find_runs(sweep)
    for run in runs:
        run.config["report"] = {"x": "max_bach"}
    rep = build_report(runs, tmp_path, plots=False)
    assert "continuous vs static" in rep.markdown  # the report's own choice
    assert capsys.readouterr().err.startswith("note: report.x names max_bach, which no run has as a setting")
