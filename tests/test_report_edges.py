"""The results side against files that are not what a run wrote, and against reports that
used to mislead: a summary cut short was read as empty (a "finished" run with no figures, and
uploaded so); edited files were tracebacks; another tool's config.yaml was a failed run; a
repeated sweep showed only its last run; a run that stopped early was compared as if it had
measured its workload; a report created MLflow databases; output folders collided or climbed
out of runs/reports; a mistyped --metrics was silently dropped."""

from __future__ import annotations

import csv
import io
import shutil
import sqlite3

import pytest

from paged_bench.report.__main__ import main as report_main
from paged_bench.report.load import RunSet, find_runs
from paged_bench.report.tables import comparison_frame, comparison_markdown, head_to_head_markdown
from paged_bench.results.whole_files import folder_name
from tests.test_report import make_sweep
from tests.tracking_support import call_cli, fresh_store, runs_of


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    jobs = [["scheduler=static"], ["scheduler=continuous"]]
    return make_sweep(tmp_path_factory.mktemp("sweep") / "sw", jobs, ("workload.num_requests=20",))


def _copy(sweep, dest):
    return shutil.copytree(sweep, dest, ignore=shutil.ignore_patterns("report"))


def _report(capsys, *args):
    code = report_main([*map(str, args), "--no-plots"])
    return code, capsys.readouterr()


@pytest.mark.parametrize("edit, says", [
    (lambda d: (d / "0/summary.json").write_text((d / "1/summary.json").read_text()[:200]), "0/summary.json: not JSON"),
    (lambda d: (d / "0/summary.json").write_text("[1, 2, 3]"), "0/summary.json: a JSON list, not an object"),
    (lambda d: (d / "0/config.yaml").write_text("max_batch: [unclosed"), "0/config.yaml: not YAML"),
    (lambda d: (d / "0/steps.csv").write_text("step,batch_size\n0,1\n"), "0/steps.csv: has no column time"),
])  # fmt: skip
def test_a_run_file_cut_short_or_edited_is_one_line_naming_it(sweep, tmp_path, capsys, edit, says):
    folder = _copy(sweep, tmp_path / "edited")
    edit(folder)
    code, out = _report(capsys, folder) if "steps" not in says else (report_main([str(folder)]), capsys.readouterr())
    assert code == 1 and "Traceback" not in out.err
    (line,) = out.err.strip().splitlines()
    assert line.startswith(f"error: {folder / says.split(':')[0]}:") and says.split(": ", 1)[1] in line
    assert "cut short or edited? (fix or remove it)" in line


def test_a_figure_that_is_no_number_shows_no_gain(sweep, tmp_path, capsys):
    folder = _copy(sweep, tmp_path / "text_figure")
    summary = folder / "1/summary.json"
    summary.write_text(summary.read_text().replace('"output_throughput": ', '"output_throughput": "fast", "x": '))
    code, out = _report(capsys, folder)
    assert code == 0, out.err
    row = next(line for line in out.out.splitlines() if "output throughput" in line)
    assert "fast" in row and row.rstrip(" |").endswith("n/a")


def test_another_tools_config_is_not_a_run(tmp_path, capsys):
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s/config.yaml").write_text("apiVersion: v1\nkind: Pod\n")
    (tmp_path / "other_hydra/.hydra").mkdir(parents=True)
    (tmp_path / "other_hydra/.hydra/config.yaml").write_text("model: resnet\nlr: 0.1\n")
    code, out = _report(capsys, tmp_path)
    assert code == 1 and "no runs found in" in out.err
    assert not (tmp_path / "k8s/report").exists()


def test_a_repeated_sweep_shows_every_run_and_a_run_that_stopped_early_no_figures(sweep, tmp_path):
    for name in ("a", "b"):
        _copy(sweep, tmp_path / name)
    runs = find_runs(tmp_path)
    table = head_to_head_markdown(RunSet.of(runs), ["output_throughput"])
    lines = table.splitlines()
    assert lines[0].split("|")[1].strip() == "repeat" and len(lines) == 4  # header, rule, two repeats
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["1", "2"]

    stopped = runs[1]  # the first copy's continuous run: as if it had stopped with 1 of 20 served
    stopped.status, stopped.summary["output_throughput"] = "failed", 1.0
    table = head_to_head_markdown(RunSet.of(runs), ["output_throughput"])
    first = table.splitlines()[2].split("|")
    assert first[4].strip() == "failed" and first[5].strip() == "n/a"  # no figure, no gain from a partial run


def test_report_output_folders_neither_collide_nor_climb_out(sweep, tmp_path, capsys):
    one, two = _copy(sweep, tmp_path / "p1" / "sw"), _copy(sweep, tmp_path / "p2" / "sw")
    code, _ = _report(capsys, one, two, "--out", tmp_path / "out")
    assert code == 0 and (tmp_path / "out/sw/report.md").is_file() and (tmp_path / "out/sw-2/report.md").is_file()
    # an experiment's name as its report's folder under runs/reports (and its artifacts' folder)
    assert folder_name("../../etc") == "_.._etc" and folder_name("a/b/c") == "a_b_c" and folder_name("..") == "_"


def test_a_mistyped_metric_is_an_error(sweep, capsys):
    code, out = _report(capsys, sweep, "--metrics", "output_throughput,bogus")
    assert code == 2
    (line,) = out.err.strip().splitlines()
    assert line.startswith("error: --metrics='output_throughput,bogus' is not allowed: summary keys such as")
    assert "(bogus: not a figure of these runs)" in line
    assert _report(capsys, sweep, "--metrics", "output_throughput")[0] == 0


def test_a_report_never_creates_or_alters_a_database(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "x.db"
    code, out = _report(capsys, "--experiment", "e", "--tracking-uri", f"sqlite:///{missing}")
    assert code == 1 and f"no MLflow store at {missing}" in out.err and not missing.parent.exists()
    other = tmp_path / "app.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE users (id INTEGER)")
    code, out = _report(capsys, "--experiment", "e", "--tracking-uri", f"sqlite:///{other}")
    assert code == 1 and "is an SQLite database but not an MLflow store" in out.err
    with sqlite3.connect(other) as db:
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["users"]


def test_sync_leaves_an_unreadable_run_out_and_uploads_the_others(tmp_path):
    uri = fresh_store(tmp_path)
    for batch in (4, 8, 12):
        assert call_cli(tmp_path, f"max_batch={batch}", "tracking.enabled=false").returncode == 0
    first, second, third = sorted(p.parent for p in tmp_path.glob("runs/20*/*/summary.json"))
    (first / "summary.json").write_text((first / "summary.json").read_text()[:100])
    (second / "steps.csv").write_text("step,time\n0,abc\n")
    proc = call_cli(tmp_path, str(tmp_path / "runs"), module="paged_bench.tracking.sync")
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: not uploaded:")]
    assert len(errors) == 2 and str(first / "summary.json") in errors[0] + errors[1]
    assert any(str(second / "steps.csv") in e for e in errors)
    assert proc.stdout.strip().endswith("2 unreadable run(s) left out")
    _, runs = runs_of(uri, "paged_bench")
    assert [r.data.tags["run_dir"] for r in runs] == [str(third)]  # and no empty FAILED run for the others


def test_a_sweep_over_workloads_compares_the_options_chosen_not_the_plugins(tmp_path):
    # workload=seed runs the poisson plugin: the report put the seed job in poisson's column
    proc = call_cli(tmp_path, "-m", "tracking.enabled=false", "workload=poisson,seed")
    assert proc.returncode == 0, proc.stderr
    (sweep,) = tmp_path.glob("runs/multirun/*/*")
    runs = RunSet.of(find_runs(sweep))
    assert runs.policy == "workload.name" and runs.policy_values() == ["poisson", "seed"]
    assert "Tight layout" not in proc.stderr


def test_a_report_says_what_every_run_was_given_beside_what_varies(tmp_path):
    # the table shows what varies: a sweep's fixed max_batch=8 (beside +experiment=..., whose
    # question reads "at the same max_batch") was nowhere in its report
    fresh_store(tmp_path)
    proc = call_cli(tmp_path, "-m", "scheduler=static,continuous", "max_batch=8", "workload.num_requests=5",
                   "experiment_name=fixed", "hydra.sweep.dir=sweep")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = "Every run: `max_batch=8 workload.num_requests=5 experiment_name=fixed`"  # not the store's settings
    assert said in (tmp_path / "sweep" / "report" / "report.md").read_text().splitlines()
    # and from MLflow, as report --experiment fetches the sweep
    proc = call_cli(tmp_path, "--experiment", "fixed", "--out", "from_mlflow", module="paged_bench.report")
    assert proc.returncode == 0, proc.stderr
    assert said in (tmp_path / "from_mlflow" / "report.md").read_text().splitlines()


def test_a_sweeps_columns_are_set_on_the_command_line_and_a_typo_is_said(tmp_path):
    # report.metrics was no key of the config: it took +report.metrics=..., and a typo in it
    # was a column of n/a and no word
    proc = call_cli(tmp_path, "-m", "tracking.enabled=false", "workload.num_requests=10", "max_batch=4,8",
                   "report.metrics=[p99_ttft_ms,p99_ttft_msx]", "slo.ttft_ms=100")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| max_batch"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["max_batch", "TTFT p99 (ms)", "p99_ttft_msx"]
    assert "note: report.metrics names p99_ttft_msx, which none of these runs has" in proc.stderr


def test_a_boolean_setting_is_shown_as_the_config_spells_it(tmp_path):
    """The prefix-caching experiment's table said ``False``/``True`` (and ``True vs False``)
    where its sweep says ``allocator.prefix_caching=false,true``."""
    jobs = [[f"allocator.prefix_caching={v}"] for v in ("false", "true")]
    rs = RunSet.of(find_runs(make_sweep(tmp_path, jobs, ("workload.num_requests=8", "tracking.enabled=false"))))
    assert rs.policy == "allocator.prefix_caching"
    table = comparison_markdown(rs, ["prefix_cache_hit_rate"])
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == ["false", "true"]
    head = head_to_head_markdown(rs, ["prefix_cache_hit_rate"]).splitlines()[0]
    assert [c.strip() for c in head.strip("|").split("|")] == ["metric", "false", "true", "true vs false"]
    assert [rs.label(r) for r in rs.runs] == ["allocator.prefix_caching=false", "allocator.prefix_caching=true"]
    rows = list(csv.DictReader(io.StringIO(comparison_frame(rs).to_csv(index=False))))  # table.csv: it said True
    assert [row["allocator.prefix_caching"] for row in rows] == ["false", "true"]
