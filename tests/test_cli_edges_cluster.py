"""Cluster command lines at the edges: routers with one replica, links, replica counts and the
cluster's memory check, each refused in one line before the work (tests/test_cli_edges.py holds
the other commands' edges)."""

from __future__ import annotations

import json

import pytest

from paged_bench.cluster import cluster_bench as cluster_build
from paged_bench.cluster.spec import cluster_spec
from paged_bench.errors import ConfigError
from paged_bench.run import memory
from paged_bench.run.bench import build_engine
from tests.test_cli_edges import command, one_error_line

# 1. a router with one replica: ran unchecked, as if it were round robin


@pytest.mark.parametrize("overrides", [
    ("router=prefix_affinity", "router.max_imbalance=-1"),
    ("router=power_of_two", "router.seed=abc"),
    ("router=least_kv",),
])  # fmt: skip
def test_a_router_with_one_replica_is_refused(config, overrides):
    with pytest.raises(ConfigError) as e:
        cluster_spec(config(*overrides))
    assert e.value.key == "router" and e.value.value == overrides[0].split("=")[1]
    assert "round_robin (the default) with one replica: a router needs two or more replicas" in str(e.value)


def test_the_default_router_with_one_replica_still_runs_and_its_settings_are_checked(config):
    assert cluster_spec(config()) is None and cluster_spec(config("router=round_robin")) is None
    with pytest.raises(ConfigError) as e:
        cluster_spec(config("+router.bogus=1"))
    assert e.value.key == "router.bogus"
    assert cluster_spec(config("router=prefix_affinity", "cluster.replicas=2")).num_replicas == 2


def test_a_renamed_plugin_and_a_cluster_run_are_labelled_by_what_ran(tmp_path):
    # router.name=least_kv ran least_kv under the option round_robin: the header named the option,
    # and a cluster's run_info.json named its workload's plugin (poisson), not its option (seed)
    proc = command(tmp_path, "paged_bench", "tracking.enabled=false", "workload.num_requests=20", "cluster.replicas=2",
                   "router.name=least_kv", f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "workload=seed, scheduler=continuous, allocator=paged, backend=sim, router=least_kv ->" in proc.stdout
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert info["choices"]["router"] == "least_kv" and info["choices"]["workload"] == "seed"


def test_a_job_that_fails_to_build_is_labelled_with_its_options(tmp_path):
    # its row in the sweep's table named the plugin (poisson) where the finished job's said seed
    proc = command(tmp_path, "paged_bench", "-m", "tracking.enabled=false", "workload.num_requests=10",
                   "max_batch=4,0", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert proc.returncode == 1 and "max_batch=0 is not allowed" in proc.stderr
    infos = [json.loads((tmp_path / "sweep" / job / "run_info.json").read_text()) for job in ("0", "1")]
    assert [i.get("status", "finished") for i in infos] == ["finished", "failed"]
    assert [i["choices"]["workload"] for i in infos] == ["seed", "seed"]


def test_a_sweep_over_routers_on_one_replica_is_refused_before_its_first_job(tmp_path):
    # every job but round robin's failed at its start, after the first had run
    proc = command(tmp_path, "paged_bench", "-m", "tracking.enabled=false", "workload.num_requests=10",
                   "router=round_robin,least_kv", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert proc.returncode == 2 and not (tmp_path / "sweep").exists()
    assert one_error_line(proc) == (
        "error: router='least_kv' is not allowed: round_robin (the default) with one replica: "
        "a router needs two or more replicas (set cluster.replicas=N, N >= 2, to compare routers)")
    proc = command(tmp_path, "paged_bench", "-m", "tracking.enabled=false", "workload.num_requests=10",
                   "router=round_robin,least_kv", "cluster.replicas=2", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_a_capacity_sweep_from_one_replica_up_keeps_its_router(tmp_path):
    # -m cluster.replicas=1,2 router=least_kv was refused for its one-replica job: a capacity
    # question (how many replicas?) could not start from one
    proc = command(tmp_path, "paged_bench", "-m", "tracking.enabled=false", "workload.num_requests=10",
                   "router=least_kv", "cluster.replicas=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "note: router=least_kv has one replica to route to (cluster.replicas=1): the engine runs alone" in proc.stderr
    one, two = (json.loads((tmp_path / "sweep" / job / "summary.json").read_text()) for job in ("0", "1"))
    assert "num_replicas" not in one and two["num_replicas"] == 2


def test_a_router_with_one_replica_is_one_line_from_the_command(tmp_path):
    proc = command(tmp_path, "paged_bench", "tracking.enabled=false", "workload.num_requests=20",
                   "router=prefix_affinity", f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert "a router needs two or more replicas" in one_error_line(proc)
    assert not (tmp_path / "run" / "summary.json").exists()


# 4. cluster.link given a list or a mapping: "unhashable type" traceback


@pytest.mark.parametrize("link", [[1, 2], {"a": 1}])
def test_a_link_that_is_not_a_name_is_refused(config, link):
    cfg = config("cluster.replicas=2")
    cfg["cluster"]["link"] = link
    with pytest.raises(ConfigError) as e:
        cluster_spec(cfg)
    assert e.value.key == "cluster.link" and e.value.value == link


# 8. replica counts that are not integers were read as 0


@pytest.mark.parametrize("key, value", [
    ("prefill_replicas", ""), ("prefill_replicas", False), ("prefill_replicas", []), ("prefill_replicas", {}),
    ("decode_replicas", False), ("decode_replicas", ""),
])  # fmt: skip
def test_a_replica_count_that_is_no_integer_is_refused(config, key, value):
    cfg = config("cluster.replicas=2")
    cfg["cluster"][key] = value
    with pytest.raises(ConfigError) as e:
        cluster_spec(cfg)
    assert e.value.key == f"cluster.{key}" and e.value.value == value


def test_unset_replica_counts_still_mean_colocated(config):
    cfg = config("cluster.replicas=2")
    cfg["cluster"].update(prefill_replicas=None, decode_replicas=None)
    assert cluster_spec(cfg).num_decode == 2 and not cluster_spec(cfg).disaggregated
    cfg["cluster"].update(prefill_replicas=0, decode_replicas=0)
    assert cluster_spec(cfg).num_decode == 2


# 9. a cluster's memory check: N copies against the memory the replicas already built had left


def _pool_bytes(cfg, monkeypatch) -> int:
    """The least memory one replica's KV pool is allowed in (bisected: the formula is memory.py's)."""

    low, high = 0, 2**40
    while high - low > 1:
        mid = (low + high) // 2
        monkeypatch.setattr(memory, "available_memory", lambda mid=mid: mid)
        try:
            build_engine(cfg)
            high = mid
        except ConfigError:
            low = mid
    return high


def test_a_cluster_that_fits_is_not_refused_and_one_that_does_not_is_refused_first(config, monkeypatch):

    cfg = config("cluster.replicas=4", "workload.num_requests=8")
    one = _pool_bytes(cfg, monkeypatch)
    built, real = [], cluster_build.build_engine

    def counting(cfg, copies=1):
        engine = real(cfg, copies=copies)
        built.append(copies)
        return engine

    monkeypatch.setattr(cluster_build, "build_engine", counting)
    total = [4 * one]  # exactly four pools; each replica built takes its own (the workload's, once built: any)
    monkeypatch.setattr(memory, "available_memory", lambda: total[0] - len(built) * one if len(built) < 4 else 2**40)
    cluster_build.build_cluster(cfg, cluster_spec(cfg))  # refused at the second replica: 4 pools in 3 left
    assert built == [4, 1, 1, 1]

    built.clear()
    total[0] = 4 * one - 1
    with pytest.raises(ConfigError) as e:
        cluster_build.build_cluster(cfg, cluster_spec(cfg))
    assert e.value.key == "cluster.replicas" and e.value.value == 4 and built == []  # before the first replica was made
    assert "or fewer num_blocks" in str(e.value)
