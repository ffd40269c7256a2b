"""The experiment registry (conf/experiment/): every experiment is documented, composes and
builds for every job of its sweep, and on backend=sim shows what it says it shows; the
seeds' experiment reproduces their shape through the CLI and the report."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from paged_bench.cli import catalog
from paged_bench.cli.sweep_jobs import job_overrides
from paged_bench.model import weights
from paged_bench.report import canvas
from paged_bench.report.document import build_report
from paged_bench.report.load import RunSet, find_runs, save_config
from paged_bench.report.tables import DEFAULT_METRICS
from paged_bench.run.bench import build
from paged_bench.run.job import run_job
from tests.tracking_support import call_cli

CONF = Path(__file__).resolve().parents[1] / "conf" / "experiment"
EXPERIMENTS = sorted(p.stem for p in CONF.glob("*.yaml"))


def test_the_registry_has_the_issues_experiments():
    assert {"seed_batching", "seed_paging", "block_size", "overload", "uniform_lengths", "pool_exhaustion",
            "prefix_caching"} <= set(EXPERIMENTS)  # fmt: skip


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_experiment_says_which_question_it_answers(name):
    lines = (CONF / f"{name}.yaml").read_text().splitlines()
    assert lines[0] == "# @package _global_"  # Hydra reads the header before any other comment
    assert lines[1].startswith("# Question: ") and lines[1].endswith("?")
    (entry,) = [e for e in catalog.experiments() if e.name == name]
    assert entry.question.endswith("?") and entry.sweep


@cache
def jobs(name: str) -> list[tuple[list[str], dict]]:
    """Every job of the experiment's sweep: its overrides and its resolved config."""
    with initialize_config_module("paged_bench.conf", version_base="1.3"):
        base = compose("config", overrides=[f"+experiment={name}"], return_hydra_config=True)
        out = []
        for overrides in job_overrides(base):  # the sweep's own, then +experiment=NAME, as Hydra passes them
            cfg = compose("config", overrides=overrides)
            out.append(
                ([o for o in overrides if not o.startswith("+experiment=")], OmegaConf.to_container(cfg, resolve=True))
            )
    return out


# the experiments whose figures the tests below read: each job is built as it is run, once
# (``results``), not built a second time on its own (test_cluster_experiments.py's are built here
# and run there, a file that may run in another process of pytest -n)
MEASURED = {"seed_batching", "seed_paging", "block_size", "overload", "uniform_lengths", "pool_exhaustion",
            "prefix_caching", "tp_tradeoff"}  # fmt: skip


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_job_of_every_experiment_composes_and_builds(name):
    all_jobs = jobs(name)
    assert len(all_jobs) >= 2
    for overrides, cfg in all_jobs:
        assert cfg["experiment_name"] == name  # MLflow groups its runs under its name
    if name in MEASURED:  # every value checked and every plugin constructed as the job ran
        assert all(ran.requests for ran in runs(name).values())
        return
    with pytest.MonkeyPatch.context() as mp:  # each job's random weights drawn once, not once per job
        mp.setattr(weights, "random_state", _drawn_once(weights.random_state))
        for overrides, cfg in all_jobs:
            bench = build(cfg)  # every value checked, every plugin constructed
            assert bench.requests, overrides


def _drawn_once(random_state):
    """``random_state`` remembered by its arguments: the jobs of hf_generate_vs_engine (both
    backends, 1 and 8 requests) build the same 200M random weights (same model, same seed: the
    same numbers), 0.5 CPU-seconds each; every job still builds its backend from them. A copy
    of the dict each time (a loader may take keys out of it); the arrays are only read."""
    drawn: dict = {}

    def once(cfg, seed):
        if (cfg, seed) not in drawn:
            drawn[cfg, seed] = random_state(cfg, seed)
        return dict(drawn[cfg, seed])

    return once


@dataclass(frozen=True)
class Ran:
    """What a job of an experiment measured (its summary) and how many requests it was given."""

    summary: dict
    requests: int


@cache
def runs(name: str) -> dict[str, Ran]:
    """Run every job of the experiment on the sim, keyed by its overrides."""
    out = {}
    for overrides, cfg in jobs(name):
        assert cfg["backend"]["name"] == "sim"
        with tempfile.TemporaryDirectory(prefix="pb-exp-") as run_dir:  # only the summary is kept
            outcome = run_job(cfg, Path(run_dir))
        assert outcome.status == "finished", (overrides, outcome.error)
        out[" ".join(overrides)] = Ran(outcome.summary, len(outcome.result.requests))
    return out


def results(name: str) -> dict[str, dict]:
    """The summary of every job of the experiment, keyed by its overrides."""
    return {key: ran.summary for key, ran in runs(name).items()}


def ttft_gain(r: dict[str, dict], max_batch: int) -> float:
    """How many times lower continuous batching's median TTFT is than static's."""
    static, continuous = (r[f"scheduler={s} max_batch={max_batch}"]["median_ttft_ms"] for s in ("static", "continuous"))
    return static / continuous


def test_seed_batching_continuous_cuts_ttft_more_as_the_batch_widens():
    r = results("seed_batching")
    gain = {b: ttft_gain(r, b) for b in (2, 4, 8, 16, 32)}
    assert gain[16] > 4 and gain[32] > gain[16]  # several-fold at 16, more at 32
    for scheduler in ("static", "continuous"):
        throughput = [r[f"scheduler={scheduler} max_batch={b}"]["output_throughput"] for b in (2, 4, 8, 16, 32)]
        assert throughput == sorted(throughput), (scheduler, throughput)  # rises with max_batch


def test_seed_paging_contiguous_reserves_several_times_more():
    r = results("seed_paging")
    contiguous, paged = r["allocator=contiguous"], r["allocator=paged"]
    assert contiguous["kv_live_slots_peak"] == paged["kv_live_slots_peak"]  # the same tokens live
    assert contiguous["kv_reserved_slots_peak"] > 3 * paged["kv_reserved_slots_peak"]
    assert paged["kv_waste_pct"] < 10 < contiguous["kv_waste_pct"]


def test_block_size_trades_waste_for_table_size():
    r = results("block_size")
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    waste = [r[f"block_size={b}"]["kv_waste_pct"] for b in sizes]
    entries = [r[f"block_size={b}"]["kv_reserved_slots_peak"] / b for b in sizes]
    assert waste == sorted(waste) and waste[0] == 0 and waste[-1] > 20
    assert entries == sorted(entries, reverse=True)


def test_overload_static_falls_furthest_behind():
    r = results("overload")
    static, continuous = r["scheduler=static"], r["scheduler=continuous"]
    assert static["median_ttft_ms"] > continuous["median_ttft_ms"] > 1000  # everyone queues at 100 req/s
    assert static["output_throughput"] < continuous["output_throughput"]
    assert r["scheduler=preemptive"]["num_preemptions"] == 0  # the pool holds max_batch full sequences


def test_uniform_lengths_static_nearly_catches_up():
    uniform, heavy = results("uniform_lengths"), results("seed_batching")
    for b in (16, 32):
        gap = {"uniform": ttft_gain(uniform, b), "heavy": ttft_gain(heavy, b)}
        assert gap["uniform"] < gap["heavy"], (b, gap)
        throughput = uniform[f"scheduler=static max_batch={b}"]["output_throughput"]
        assert throughput > 0.85 * uniform[f"scheduler=continuous max_batch={b}"]["output_throughput"]


def test_pool_exhaustion_preempts_more_as_the_pool_shrinks():
    r = results("pool_exhaustion")
    for mode in ("recompute", "swap"):
        preemptions = [r[f"scheduler.mode={mode} num_blocks={n}"]["num_preemptions"] for n in (256, 128, 64, 40)]
        assert preemptions == sorted(preemptions) and preemptions[-1] > 0, (mode, preemptions)
        assert all(r[f"scheduler.mode={mode} num_blocks={n}"]["completed"] == 48 for n in (256, 128, 64, 40))
    assert r["scheduler.mode=swap num_blocks=40"]["swapped_blocks"] > 0
    assert r["scheduler.mode=swap num_blocks=40"]["recomputed_tokens"] == 0
    assert r["scheduler.mode=recompute num_blocks=40"]["recomputed_tokens"] > 0


def test_prefix_caching_hits_and_cuts_ttft():
    r = results("prefix_caching")
    off, on = r["allocator.prefix_caching=False"], r["allocator.prefix_caching=True"]
    assert off["prefix_cache_hit_rate"] == 0 and on["prefix_cache_hit_rate"] > 0.5
    assert on["median_ttft_ms"] < off["median_ttft_ms"] / 5


def test_the_listing_command_shows_every_experiment(tmp_path):
    proc = call_cli(tmp_path, "--experiments")
    assert proc.returncode == 0, proc.stderr
    for name in EXPERIMENTS:
        (line,) = [l for l in proc.stdout.splitlines() if l.strip().startswith(name + " ")]
        assert line.rstrip().endswith("?")


@pytest.mark.slow
def test_seed_batching_through_the_cli_and_its_report(tmp_path):
    """The README's results: the issue's command, then the report of its sweep."""
    proc = call_cli(tmp_path, "-m", "+experiment=seed_batching", "backend=sim", "tracking.enabled=false")
    assert proc.returncode == 0, proc.stderr
    (sweep_dir,) = [p.parent for p in tmp_path.glob("runs/multirun/*/*/sweep.json")]
    # the sweep drew its plots into its report folder as it closed (the PNGs checked below); the
    # command's table and markdown are this test's, its plots (drawn by the same code a second
    # time) test_report.py's --md and --into tests'
    report = call_cli(tmp_path, str(sweep_dir), "--no-plots", module="paged_bench.report")
    assert report.returncode == 0, report.stderr
    md = report.stdout
    assert md.startswith("### seed_batching") and "continuous vs static" in md
    s16 = json.loads((sweep_dir / "3" / "summary.json").read_text())  # job 3: static, max_batch 16
    c16 = json.loads((sweep_dir / "8" / "summary.json").read_text())  # job 8: continuous, max_batch 16
    row = next(l for l in md.splitlines() if l.startswith("|        16 | TTFT p50"))
    assert f"{s16['median_ttft_ms']:,.0f}" in row and f"{c16['median_ttft_ms']:,.0f}" in row
    assert f"{s16['median_ttft_ms'] / c16['median_ttft_ms']:.2f}x" in row
    for png in ("ttft_cdf.png", "vs_max_batch.png", "kv_over_time.png"):
        assert (sweep_dir / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tp_tradeoff_tp_cuts_itl_less_than_linearly_and_costs_throughput_per_gpu():
    r = results("tp_tradeoff")

    def fig(tp: int, model: str, rate: float, key: str) -> float:
        return r[f"backend.tensor_parallel_size={tp} backend.model={model} workload.rate={rate}"][key]

    itl_70b = [fig(tp, "llama-3-70b", 1.0, "median_itl_ms") for tp in (1, 2, 4, 8)]
    assert itl_70b == sorted(itl_70b, reverse=True) and itl_70b[1] > 0.5 * itl_70b[0]  # less than 2x per doubling
    itl_8b = [fig(tp, "llama-3-8b", 1.0, "median_itl_ms") for tp in (1, 2, 4, 8)]
    assert itl_8b[1] / itl_8b[0] > itl_70b[1] / itl_70b[0] and itl_8b[3] > itl_8b[2]  # small model: little, then worse
    per_gpu = [fig(tp, "llama-3-8b", 200.0, "output_throughput_per_gpu") for tp in (1, 2, 4, 8)]
    assert per_gpu == sorted(per_gpu, reverse=True)
    # one GPU barely holds 70B: a short pool preempts; a second rank nearly doubles the throughput
    assert fig(1, "llama-3-70b", 200.0, "num_preemptions") > 0 == fig(2, "llama-3-70b", 200.0, "num_preemptions")
    assert fig(2, "llama-3-70b", 200.0, "output_throughput") > 1.5 * fig(1, "llama-3-70b", 200.0, "output_throughput")


def synthetic_sweep(name: str, root: Path) -> Path:
    """The experiment's sweep folder as its jobs leave it, each job's config its own, its figures
    and tables made up (cheap: no job runs); a remote target's run has no engine steps, and the
    first with steps preempts once."""
    preempted = False
    for num, (overrides, cfg) in enumerate(jobs(name)):
        run_dir = root / str(num)
        save_config(run_dir, cfg)
        metrics = [*DEFAULT_METRICS, *((cfg.get("report") or {}).get("metrics") or [])]
        (run_dir / "summary.json").write_text(json.dumps({m: 10.0 ** (num % 4) + num for m in metrics}))
        choices = dict(o.split("=", 1) for o in overrides if "." not in o.split("=", 1)[0])
        (run_dir / "run_info.json").write_text(json.dumps({"status": "finished", "choices": choices}))
        (run_dir / "requests.csv").write_text("ttft_ms\n" + "".join(f"{num + i}.5\n" for i in range(5)))
        if not cfg["target"].get("spawn") and cfg["target"]["name"] != "openai":
            rows = "".join(f"{t},0.1,{t * 10},{t * 16},{int(not preempted and t == 2)},1\n" for t in range(1, 5))
            preempted = True
            (run_dir / "steps.csv").write_text("time,duration,kv_live_slots,kv_reserved_slots,preemptions,running\n"
                                               + rows)  # fmt: skip
    return root


@dataclass
class Drawn:
    """An experiment's report of synthetic runs: the runs, the figures by file name (drawn, not
    written: PNG encoding is most of a report's time) and the report."""

    runs: list
    figures: dict
    report: Any


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """``drawn(name)``: the experiment's report, made once; ``undeclare``: as if its YAML
    declared no axes."""
    made: dict[tuple[str, bool], Drawn] = {}

    def report_of(name: str, undeclare: bool = False) -> Drawn:
        if (name, undeclare) not in made:
            root, figures = tmp_path_factory.mktemp(name), {}
            runs = find_runs(synthetic_sweep(name, root / "sweep"))
            for run in runs if undeclare else ():
                run.config["report"] = {"metrics": run.config["report"]["metrics"]}
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(canvas, "write_png", lambda fig, path: figures.setdefault(path.name, fig))
                made[name, undeclare] = Drawn(runs, figures, build_report(runs, root / "report", title=name))
        return made[name, undeclare]

    return report_of


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_figure_of_every_experiments_report_shows_every_run(name, drawn):
    """tp_tradeoff's KV plot showed 12 of its 16 runs (a 12-panel cap), with no word of the
    other 4: each figure, over its pages, draws every run or names it in a note."""
    runs, report = drawn(name).runs, drawn(name).report
    assert len(runs) == len(jobs(name))
    rs = RunSet.of(runs)
    assert rs.notes == []  # the axes the experiment declares are settings its sweep varies
    shown: dict[str, set[str]] = {}
    for plot in report.plots:
        stem = plot.path.stem.rstrip("0123456789").removesuffix("_") if plot.path.stem[-1].isdigit() else plot.path.stem
        shown.setdefault(stem, set()).update(plot.shown)
    assert {"ttft_cdf", "kv_over_time", "preemptions_over_time"} <= set(shown), sorted(shown)
    assert any(stem.startswith("vs_") for stem in shown) == bool(rs.axes)  # a numeric setting swept: its plot
    every = {r.source for r in runs}
    assert {stem: sorted(every - runs_shown) for stem, runs_shown in shown.items()} == {stem: [] for stem in shown}


def test_tp_tradeoff_puts_tp_on_the_x_axis_and_compares_the_tp_sizes(drawn):
    """Its YAML's axes: TP on the x axis (not the two-point rate), a line per model, a column
    of panels per rate; the table's gains compare each TP size with TP 1, not the models."""
    fig = drawn("tp_tradeoff").figures["vs_backend_tensor_parallel_size.png"]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 12  # 6 metrics x 2 rates
    assert {ax.get_title().split("\n")[1] for ax in panels} == {"workload.rate=1.0", "workload.rate=200.0"}
    for ax in panels:
        assert {tuple(line.get_xdata()) for line in ax.get_lines()} == {(1, 2, 4, 8)}
        assert {line.get_label() for line in ax.get_lines()} == {
            "backend.model=llama-3-8b",
            "backend.model=llama-3-70b",
        }
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    markdown = drawn("tp_tradeoff").report.markdown
    header = next(line for line in markdown.splitlines() if "| metric" in line)
    assert "tensor_parallel_size=2 vs 1" in header and "tensor_parallel_size=8 vs 1" in header
    assert "llama-3-70b vs" not in markdown
    # as before the YAML declared them: 8 lines a panel, their legend beside the panels, not on them
    undeclared = drawn("tp_tradeoff", undeclare=True)
    fig = undeclared.figures["vs_workload_rate.png"]
    assert not any(ax.get_legend() for ax in fig.axes) and len(fig.legends) == 1
    assert len(fig.legends[0].get_texts()) == 8 and fig.legends[0].get_bbox_to_anchor().x0 >= fig.bbox.x1
    assert "llama-3-70b vs llama-3-8b" in undeclared.report.markdown


def test_disaggregation_counts_whole_replicas_on_a_log_scale_where_latencies_span_orders(drawn):
    figures = drawn("disaggregation").figures
    panels = {ax.get_title(): ax for ax in figures["vs_cluster_prefill_replicas.png"].axes if ax.get_visible()}
    for ax in panels.values():
        assert list(ax.get_xticks()) == [0, 1, 2, 3]  # no 0.5 replica
    # the runs' TTFTs: 1, 11, 102 and 1,003 ms (synthetic_sweep): 1,000x, on a log scale
    assert panels["TTFT p50 (ms)"].get_yscale() == "log"
    assert "prefill_replicas=1 vs 0" in drawn("disaggregation").report.markdown  # each split against colocated


def _columns(fig) -> dict[int, list[str]]:
    """A figure's visible panels' titles by grid column, top to bottom."""
    columns: dict[int, list[str]] = {}
    for ax in fig.axes:
        if ax.get_visible():
            columns.setdefault(ax.get_subplotspec().colspan.start, []).append(ax.get_title().replace("\n", " "))
    return columns


def test_tp_tradeoff_lays_every_figure_out_by_its_declared_axes(drawn):
    """Its YAML's facets (the rate) and series (the model) shaped only the versus plot: the TTFT
    CDF, KV and preemption figures are now a column per rate, each in model then TP order."""
    figures = drawn("tp_tradeoff").figures
    cdf = _columns(figures["ttft_cdf.png"])  # lines: the TP sizes compared; a panel per model and rate
    assert cdf == {column: [f"workload.rate={rate} backend.model=llama-3-{size}" for size in ("8b", "70b")]
                   for column, rate in ((0, "1.0"), (1, "200.0"))}  # fmt: skip
    kv = [_columns(figures[name]) for name in ("kv_over_time.png", "kv_over_time_2.png")]
    for column, rate in ((0, "1.0"), (1, "200.0")):
        titles = [title for page in kv for title in page[column]]
        assert all(f"workload.rate={rate}" in title for title in titles) and len(titles) == 8
        order = [(title.split("backend.model=")[1].split()[0], int(title.split("tensor_parallel_size=")[1].split()[0]))
                 for title in titles]  # fmt: skip
        assert order == [(model, tp) for model in ("llama-3-8b", "llama-3-70b") for tp in (1, 2, 4, 8)]
    panels = [ax for ax in figures["preemptions_over_time.png"].axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["workload.rate=1.0", "workload.rate=200.0"]
    assert all(len(ax.get_lines()) == 8 and not any("workload.rate" in l.get_label() for l in ax.get_lines())
               for ax in panels)  # fmt: skip
