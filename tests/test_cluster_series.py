"""A cluster's step records read as one series: each replica numbers its own steps, so the
MLflow step series and the report's KV plot, drawn row by row, jumped between replicas."""

from __future__ import annotations

import csv
import json

from paged_bench.cluster.cluster_bench import build_cluster
from paged_bench.cluster.spec import cluster_spec
from paged_bench.report.load import RunSet, load_run
from paged_bench.report.plots import kv_over_time
from paged_bench.results.run_files import format_summary
from paged_bench.results.step_series import cluster_wide
from paged_bench.run.job import run_job
from paged_bench.tracking.runs import STEP_SERIES, step_metrics

WORKLOAD = ("workload=poisson", "workload.num_requests=60", "workload.rate=20", "cluster.replicas=3")


def _replayed(rows, column):
    """``column`` summed over replicas after each row, each replica at its latest step (none once idle)."""
    latest, out = {}, []
    for row in sorted(rows, key=lambda r: float(r["time"])):
        mine = float(row[column])
        latest[row["replica"]] = mine if float(row["running"]) > 0 else 0.0
        out.append(mine + sum(v for r, v in latest.items() if r != row["replica"]))
    return out


def test_a_clusters_steps_are_its_replicas_summed_in_time_order(config, tmp_path):
    outcome = run_job(config(*WORKLOAD), tmp_path)
    assert outcome.status == "finished"
    with (tmp_path / "steps.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len({r["replica"] for r in rows}) == 3
    merged = cluster_wide(rows)
    assert [m["step"] for m in merged] == list(range(len(rows)))
    times = [m["time"] for m in merged]
    assert times == sorted(times)
    for column in ("kv_reserved_slots", "waiting", "batch_size"):
        assert [m[column] for m in merged] == _replayed(rows, column)
    assert max(m["kv_reserved_slots"] for m in merged) > max(float(r["kv_reserved_slots"]) for r in rows)
    # the summary's whole-cluster peaks are this series' (kv_*_peak are the largest replica's)
    for kind in ("live", "reserved"):
        peak = outcome.summary[f"cluster_kv_{kind}_slots_peak"]
        assert peak == max(m[f"kv_{kind}_slots"] for m in merged) > outcome.summary[f"kv_{kind}_slots_peak"]
    # MLflow's series: one point per step number, steps rising (94 points held 90 step numbers)
    metrics = step_metrics(rows, 0, 10_000)
    for name in STEP_SERIES.values():
        steps = [m.step for m in metrics if m.key == name]
        assert steps == sorted(set(steps)) and len(steps) == len(rows)
    one = [dict(r, step=str(i)) for i, r in enumerate(r for r in rows if r["replica"] == "0")]
    assert cluster_wide([{k: v for k, v in r.items() if k != "replica"} for r in one]) == [
        {k: v for k, v in r.items() if k != "replica"} for r in one]  # one engine's rows are left as they are


def test_the_kv_plot_of_a_cluster_is_drawn(config, tmp_path):
    run_job(config(*WORKLOAD), tmp_path / "run")
    (tmp_path / "plots").mkdir()
    (plot,) = kv_over_time(RunSet.of([load_run(tmp_path / "run")]), tmp_path / "plots")
    assert plot.path.is_file()


def test_a_split_clusters_decode_router_draws_its_own_pairs(config):
    cfg = config("cluster.prefill_replicas=2", "cluster.decode_replicas=2", "router=power_of_two")
    cluster = build_cluster(cfg, cluster_spec(cfg)).cluster
    draws = [[r._rng.integers(1 << 30) for _ in range(8)] for r in (cluster.router, cluster.decode_router)]
    assert draws[0] != draws[1]  # both were seeded with seed: the same pairs, prefill and decode


def test_a_report_of_clusters_shows_the_kv_peak_of_all_replicas(config, tmp_path):
    # the largest one replica reached fell as replicas were added: 1,504 slots on 2, 608 on 4
    from paged_bench.report.document import build_report

    runs = []
    for n in (1, 2, 3):  # one replica is the plain engine: its peak is its own (the table fell back)
        run_job(config(*WORKLOAD[:-1], f"cluster.replicas={n}", "slo.ttft_ms=100"), tmp_path / str(n))
        runs.append(load_run(tmp_path / str(n)))
    report = build_report(runs, tmp_path / "report", plots=False)
    assert "KV reserved peak, all replicas (slots)" in report.table and "| KV reserved peak (slots)" not in report.table
    with (tmp_path / "report" / "table.csv").open() as f:
        rows = list(csv.DictReader(f))
    single = json.loads((tmp_path / "1" / "summary.json").read_text())
    assert float(rows[0]["cluster_kv_reserved_slots_peak"]) == single["kv_reserved_slots_peak"] > 0
    assert all(row["cluster_kv_reserved_slots_peak"] for row in rows)
    assert "goodput (req/s)" in report.table  # an SLO was given: the table shows what met it


def test_a_clusters_capacity_is_all_its_replicas_and_a_decode_replica_has_no_hit_rate(config, tmp_path):
    split = run_job(config(*WORKLOAD[:-1], "cluster.prefill_replicas=1", "cluster.decode_replicas=2"), tmp_path)
    summary = split.summary
    assert summary["cluster_kv_capacity_blocks"] == 3 * summary["kv_capacity_blocks"]
    assert summary["cluster_kv_capacity_tokens"] == 3 * summary["kv_capacity_tokens"]
    assert summary["replica0/prefix_cache_hit_rate"] is not None  # the prefill replica looks prompts up
    assert summary["replica1/prefix_cache_hit_rate"] is None and summary["replica2/prefix_cache_hit_rate"] is None
    console = format_summary(summary)
    assert "KV live / reserved peak, largest replica (slots)" in console
    peaks = f"{summary['cluster_kv_live_slots_peak']} / {summary['cluster_kv_reserved_slots_peak']}"
    assert "KV live / reserved peak, all replicas (slots)" in console and peaks in console
    assert "decode replicas' load imbalance" in console
