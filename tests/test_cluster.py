"""The simulated cluster: one replica behind the loop runs exactly as the engine does, cluster
off leaves a run's files as they were, routers do what they claim on the workloads that
separate them, every request is served once with no block leaked, and bad cluster settings
are one-line errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from paged_bench.cluster.cluster_bench import build_cluster
from paged_bench.cluster.loop import Cluster
from paged_bench.cluster.replica import Replica
from paged_bench.cluster.spec import cluster_spec
from paged_bench.errors import ConfigError
from paged_bench.routers.round_robin import RoundRobinRouter
from paged_bench.run.bench import build_engine, build_workload, workload_requests
from paged_bench.run.job import run_job

# high load on 4 replicas of max_batch 8: bursty arrivals near what the cluster sustains
BURSTY = ("workload=bursty", "workload.num_requests=600", "workload.rate=30", "workload.burstiness=0.3",
          "max_batch=8", "cluster.replicas=4", "tracking.enabled=false")  # fmt: skip
# 32 system prompts of 512 tokens: a replica's pool caches about 16, so where requests go decides the hits
SHARED_PREFIX = ("workload=bursty", "workload.num_requests=600", "workload.rate=20", "workload.burstiness=0.3",
                 "workload.shared_prefix.num_prefixes=32", "workload.shared_prefix.length=512",
                 "max_model_len=1024", "num_blocks=512", "max_batch=8", "cluster.replicas=4",
                 "tracking.enabled=false")  # fmt: skip


def _timeline(requests):
    return [(r.request_id, r.first_scheduled_time, tuple(r.token_times), r.finish_time, r.finish_reason,
             r.num_preemptions, r.num_cached_tokens) for r in requests]  # fmt: skip


def test_one_replica_behind_the_loop_runs_exactly_as_the_engine(config):
    # a short pool and preemption, so admission, preemption and idling all happen
    cfg = config("workload=bursty", "workload.num_requests=150", "workload.rate=40", "scheduler=preemptive",
                 "num_blocks=48", "workload.shared_prefix.num_prefixes=2", "workload.shared_prefix.length=48")
    plain, _ = build_engine(cfg)
    reference = plain.run(workload_requests(build_workload(cfg), plain.backend))
    engine, _ = build_engine(cfg)
    requests = workload_requests(build_workload(cfg), engine.backend)
    run = Cluster([Replica(0, "colocated", engine)], RoundRobinRouter()).run(requests)
    (result,) = run.results
    assert reference.num_preemptions > 0 and reference.prefix_hit_tokens > 0
    assert _timeline(run.requests) == _timeline(reference.requests)
    assert list(result.steps) == list(reference.steps)


def _files(run_dir: Path) -> dict[str, bytes]:
    names = ("summary.json", "requests.csv", "steps.csv", "run_info.json")
    return {name: (run_dir / name).read_bytes() for name in names}


def test_cluster_off_leaves_the_run_files_byte_identical(config, tmp_path):
    cfg = config("workload.num_requests=60")
    assert cfg["cluster"]["replicas"] is None and cluster_spec(cfg) is None  # null: one engine
    without = {k: v for k, v in cfg.items() if k not in ("cluster", "router")}  # the config as it was before
    run_job(cfg, tmp_path / "off")
    run_job(without, tmp_path / "before")
    assert _files(tmp_path / "off") == _files(tmp_path / "before")
    assert not (tmp_path / "off" / "replicas.csv").exists()
    assert "replica" not in (tmp_path / "off" / "requests.csv").read_text().splitlines()[0]


def _summary(config, tmp_path, *overrides):
    outcome = run_job(config(*overrides), tmp_path / "-".join(overrides[-2:]).replace("/", "_"))
    assert outcome.status == "finished", outcome.error
    return outcome.summary


def test_least_outstanding_beats_round_robin_on_p99_ttft_under_bursty_high_load(config, tmp_path):
    rr = _summary(config, tmp_path, *BURSTY, "router=round_robin")
    lo = _summary(config, tmp_path, *BURSTY, "router=least_outstanding")
    assert rr["completed"] == lo["completed"] == 600
    assert lo["p99_ttft_ms"] < 0.8 * rr["p99_ttft_ms"], (lo["p99_ttft_ms"], rr["p99_ttft_ms"])


def test_prefix_affinity_hits_more_than_round_robin_on_shared_prefixes(config, tmp_path):
    rr = _summary(config, tmp_path, *SHARED_PREFIX, "router=round_robin")
    pa = _summary(config, tmp_path, *SHARED_PREFIX, "router=prefix_affinity")
    assert pa["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"] + 0.2
    assert pa["median_ttft_ms"] < rr["median_ttft_ms"]  # the prefill it skips is time saved
    assert pa["replica_load_imbalance"] < 1.2  # ... without piling onto one replica


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "least_kv", "power_of_two", "prefix_affinity"])
def test_every_request_is_served_once_by_the_replica_its_row_names(config, tmp_path, router):
    outcome = run_job(config(*SHARED_PREFIX[:-2], "workload.num_requests=200", "cluster.replicas=3",
                             f"router={router}"), tmp_path)  # fmt: skip
    assert outcome.status == "finished" and not outcome.result.leaks
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["request_id"]) for r in rows) == list(range(200))
    assert all(r["finish_reason"] == "length" and int(r["output_tokens"]) == int(r["max_tokens"]) for r in rows)
    per_replica = {i: sum(r["replica"] == str(i) for r in rows) for i in range(3)}
    with (tmp_path / "replicas.csv").open() as f:
        replicas = list(csv.DictReader(f))
    assert {int(r["replica"]): int(r["completed"]) for r in replicas} == per_replica
    assert all(n > 0 for n in per_replica.values())
    steps = (tmp_path / "steps.csv").read_text().splitlines()
    assert steps[0].startswith("replica,step,time") and len(steps) - 1 == outcome.summary["replica_steps"]


def test_power_of_two_is_reproducible_from_its_seed(config, tmp_path):
    placements = []
    for seed in (0, 0, 1):
        bench = build_cluster(config(*BURSTY[:-1], "router=power_of_two", f"seed={seed}", "workload.seed=0"),
                              cluster_spec(config(*BURSTY[:-1])))  # fmt: skip
        run = bench.cluster.run(bench.requests)
        placements.append([run.placement[r] for r in run.requests])
    assert placements[0] == placements[1] != placements[2]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("cluster.replicas=0",), "cluster.replicas"),
        (("cluster.decode_replicas=2",), "cluster.decode_replicas"),
        (("cluster.prefill_replicas=2", "cluster.replicas=2"), "cluster.replicas"),
        (("cluster.prefill_replicas=1", "cluster.decode_replicas=2", "cluster.replicas=4"), "cluster.replicas"),
        (("cluster.replicas=2", "cluster.link=carrier_pigeon"), "cluster.link"),
        (("cluster.replicas=2", "backend=numpy"), "backend"),  # refused before a model loads per replica
        (("cluster.replicas=2", "router.name=nearest"), "router"),
        # a transfer that never arrives left every request unfinished, with no reason given
        (("cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.link_latency_us=inf"),
         "cluster.link_latency_us"),
        # past the clock's horizon: the first transfer stopped the run mid-way
        (("cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.link_latency_us=1e30"),
         "cluster.link_latency_us"),
    ],
)
def test_bad_cluster_settings_are_one_line_errors(config, tmp_path, overrides, key):
    with pytest.raises(ConfigError) as e:
        run_job(config(*overrides, "tracking.enabled=false"), tmp_path)
    assert e.value.key == key and "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())  # nothing ran


def test_a_cluster_run_through_the_command_line(tmp_path):
    from tests.tracking_support import call_cli

    proc = call_cli(tmp_path, "cluster.replicas=2", "router=least_outstanding", "tracking.enabled=false")
    assert proc.returncode == 0, proc.stderr
    assert "router=least_outstanding" in proc.stdout
    (run_dir,) = [p.parent for p in tmp_path.glob("runs/20*/*/summary.json")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_replicas"] == 2 and summary["completed"] == 48
    assert summary["replica0/completed"] + summary["replica1/completed"] == 48
    # the console says it was a cluster, on how many GPUs (it showed one engine's figures only)
    values = [line.rsplit("  ", 1)[-1].strip() for line in proc.stdout.splitlines()
              if line.startswith(("  GPUs, output tok/s per GPU", "  replicas, load imbalance"))]  # fmt: skip
    per_gpu, imbalance = summary["output_throughput_per_gpu"], summary["replica_load_imbalance"]
    assert values == [f"2, {per_gpu:.1f}", f"2, {imbalance:.2f}"], values


@pytest.mark.parametrize("split", [(), ("cluster.prefill_replicas=1",)])
def test_a_replica_that_cannot_go_on_stops_the_cluster_with_every_request_accounted_for(config, tmp_path, split):
    # continuous batching never preempts: a short pool under load stops the run
    outcome = run_job(config("cluster.replicas=3", *split, "num_blocks=40", "workload.rate=100",
                             "workload.num_requests=200", "tracking.enabled=false"), tmp_path)  # fmt: skip
    assert outcome.status == "failed" and "KV pool exhausted" in outcome.error
    assert not outcome.result.leaks  # every replica's pool is whole again
    s = outcome.summary
    assert s["completed"] + s["failed"] == 200 and s["failed"] > 0
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 200 and all(r["finish_reason"] for r in rows)
    assert any(r["error"].startswith("not submitted") for r in rows)


def test_transfers_too_slow_for_a_float_stop_the_run_with_every_request_accounted_for(config, tmp_path):
    # 1e-320 GB/s puts every transfer's arrival at inf: the loop ended with them never delivered,
    # and no reason given
    outcome = run_job(config("cluster.prefill_replicas=1", "cluster.decode_replicas=1",
                             "cluster.link_bandwidth_gbs=1e-320", "tracking.enabled=false"), tmp_path)  # fmt: skip
    assert outcome.status == "failed" and "would pass 1e+12 s" in outcome.error
    assert "at 1e-320 GB/s and 1.5 us: raise cluster.link_bandwidth_gbs or lower cluster.link_latency_us" in (
        outcome.error)
    assert not outcome.result.leaks
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 48 and {r["finish_reason"] for r in rows} == {"error"}

def test_a_large_cluster_reads_the_installed_plugins_once_per_kind(config, monkeypatch):
    # reading every package's metadata costs ~8 ms: once per replica, 1,000 replicas took 9.5 s
    from paged_bench.run import registry

    registry._group_entry_points.cache_clear()
    groups = []
    real = registry.entry_points
    monkeypatch.setattr(registry, "entry_points", lambda group: groups.append(group) or real(group=group))
    bench = build_cluster(config("cluster.replicas=64"), cluster_spec(config("cluster.replicas=64")))
    assert len(bench.cluster.replicas) == 64
    assert sorted(groups) == sorted(set(groups)) and "paged_bench.schedulers" in groups


@pytest.mark.parametrize("split", [("cluster.replicas=12",), ("cluster.prefill_replicas=3", "cluster.decode_replicas=5")])
def test_the_next_replica_to_step_is_the_one_free_earliest_then_first_by_index(config, split, monkeypatch):
    # the loop keeps replicas with work in heaps; each step must go where a scan of every
    # replica would send it: the earliest max(free_at, now), ties to the lowest index
    bench = build_cluster(config(*split, "workload=bursty", "workload.num_requests=400", "workload.rate=200",
                                 "workload.burstiness=0.3", "max_batch=4"), cluster_spec(config(*split)))  # fmt: skip
    cluster, chosen = bench.cluster, []
    step = cluster._step

    def checked(replica):
        working = [r for r in cluster.replicas if r.has_work()]
        expected = min(working, key=lambda r: (max(r.free_at, cluster.now), r.index))
        chosen.append((replica.index, expected.index))
        step(replica)

    monkeypatch.setattr(cluster, "_step", checked)
    run = cluster.run(bench.requests)
    assert run.error is None and all(r.is_finished for r in run.requests)
    assert len(chosen) > 400 and len({i for i, _ in chosen}) == len(cluster.replicas)
    assert all(i == want for i, want in chosen)
