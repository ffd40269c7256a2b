"""Disaggregated prefill/decode: prompts are computed once, on the prefill replicas; the K/V
crosses the link at its modelled cost; decode replicas start from the prompt's K/V and
compute one token per step; the client's figures come out beside a colocated cluster's."""

from __future__ import annotations

import csv
import itertools

import numpy as np
import pytest

from paged_bench.cluster.link import LINKS
from paged_bench.model.config import PRESETS
from paged_bench.run.job import run_job

SPLIT = ("cluster.prefill_replicas=1", "cluster.decode_replicas=2", "workload.num_requests=120",
         "tracking.enabled=false")  # fmt: skip
KV_BYTES = PRESETS["llama-3-8b"].kv_bytes_per_token("bfloat16")  # the sim's default model


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture
def split_run(config, tmp_path):
    outcome = run_job(config(*SPLIT), tmp_path)
    assert outcome.status == "finished" and not outcome.result.leaks, outcome.error
    return outcome, _rows(tmp_path / "requests.csv"), _rows(tmp_path / "steps.csv")


def test_prompts_are_computed_once_on_the_prefill_replica_and_decode_starts_from_their_kv(split_run):
    outcome, requests, steps = split_run
    s = outcome.summary
    assert s["completed"] == 120 and s["num_prefill_replicas"] == 1 and s["num_decode_replicas"] == 2
    assert all(int(r["output_tokens"]) == int(r["max_tokens"]) for r in requests)
    decode = [row for row in steps if row["replica"] != "0"]
    prefill = [row for row in steps if row["replica"] == "0"]
    # the decode replicas never compute a prompt token: one token per request per step
    assert sum(int(row["prefill_tokens"]) for row in decode) == 0
    assert sum(int(row["decode_tokens"]) for row in decode) == sum(int(r["output_tokens"]) - 1 for r in requests)
    assert sum(int(row["prefill_tokens"]) for row in prefill) == sum(int(r["prompt_tokens"]) for r in requests)
    assert {r["prefill_replica"] for r in requests} == {"0"} and {r["replica"] for r in requests} == {"1", "2"}


def test_the_kv_transfer_is_priced_from_the_model_and_the_link(split_run):
    outcome, requests, _ = split_run
    s = outcome.summary
    moved = [r for r in requests if int(r["max_tokens"]) > 1]
    assert s["num_kv_transfers"] == len(moved)
    assert s["kv_transfer_bytes"] == KV_BYTES * sum(int(r["prompt_tokens"]) for r in moved)
    nvlink = LINKS["nvlink4"]
    for r in moved:  # never faster than the wire; more only when queued behind another transfer
        wire_ms = (nvlink.latency + KV_BYTES * int(r["prompt_tokens"]) / nvlink.bandwidth) * 1e3
        assert float(r["kv_transfer_ms"]) >= wire_ms - 1e-9


def test_a_slower_link_delays_the_second_token_not_the_first(config, tmp_path):
    fast = run_job(config(*SPLIT), tmp_path / "fast").summary
    slow_run = run_job(config(*SPLIT, "cluster.link=ethernet", "cluster.link_bandwidth_gbs=1"), tmp_path / "slow")
    slow = slow_run.summary
    assert slow["median_ttft_ms"] == fast["median_ttft_ms"]  # the prefill side does not see the link
    # a P/D proxy's client waits for the decode replica's first token: it sees the link
    assert slow["median_decode_ttft_ms"] > fast["median_decode_ttft_ms"] + slow["mean_kv_transfer_ms"] / 2
    seconds = sorted((r.token_times[1] - r.arrival_time) * 1e3 for r in slow_run.result.requests
                     if len(r.token_times) > 1)  # fmt: skip
    assert slow["p99_decode_ttft_ms"] == pytest.approx(float(np.percentile(seconds, 99)))
    assert slow["median_decode_ttft_ms"] == pytest.approx(float(np.median(seconds)))
    assert fast["median_decode_ttft_ms"] > fast["median_ttft_ms"]
    assert slow["mean_kv_transfer_ms"] > 50 * fast["mean_kv_transfer_ms"]
    assert slow["p99_itl_ms"] > fast["p99_itl_ms"] + slow["mean_kv_transfer_ms"] / 2
    assert slow["kv_transfer_bytes"] == fast["kv_transfer_bytes"]


def test_an_slo_is_judged_on_what_a_pd_proxys_client_sees_too(config, tmp_path):
    # the headline TTFT is the prefill's token; a P/D proxy's client reads the decode replica's,
    # which no SLO could be applied to and requests.csv did not have
    slo = ("slo.ttft_ms=60", "slo.tpot_ms=20")
    summary = run_job(config(*SPLIT, "cluster.link=ethernet", "cluster.link_bandwidth_gbs=1", *slo), tmp_path).summary
    rows = _rows(tmp_path / "requests.csv")
    decode_ttft = [float(r["decode_ttft_ms"]) for r in rows if r["decode_ttft_ms"]]
    assert summary["median_decode_ttft_ms"] == pytest.approx(float(np.median(decode_ttft)))
    seen_good = 0
    for r in rows:  # the proxy's client sees the tokens after the prefill's: TPOT over them
        ttft, e2el, n = float(r["decode_ttft_ms"] or r["ttft_ms"]), float(r["e2el_ms"]), int(r["output_tokens"])
        n -= n > 1  # a request that ended at its prefill is seen with its one token
        tpot = (e2el - ttft) / (n - 1) if n > 1 else 0.0
        seen_good += ttft <= 60 and tpot <= 20
    assert summary["decode_goodput"] == pytest.approx(seen_good / summary["duration"])
    assert 0 < summary["decode_goodput"] < summary["goodput"]  # the link's wait fails some the headline passes


def test_split_and_colocated_clusters_of_equal_size_serve_the_same_tokens(config, tmp_path):
    split = run_job(config(*SPLIT), tmp_path / "split").summary
    colocated = run_job(config("cluster.replicas=3", *SPLIT[2:]), tmp_path / "colocated").summary
    assert split["num_replicas"] == colocated["num_replicas"] == 3
    assert split["total_output_tokens"] == colocated["total_output_tokens"]
    assert "kv_transfer_bytes" not in colocated
    # decode batches hold no prefill chunks, so tokens after the first come at an even pace
    assert split["p99_itl_ms"] < colocated["p99_itl_ms"]


def test_a_one_token_request_ends_on_its_prefill_replica_without_a_transfer(config, tmp_path):
    outcome = run_job(config(*SPLIT, "workload.output_len=1"), tmp_path)
    assert outcome.summary["completed"] == 120 and outcome.summary["num_kv_transfers"] == 0
    assert {r["replica"] for r in _rows(tmp_path / "requests.csv")} == {"0"}


def test_a_handed_over_request_enters_the_plan_once_with_its_prompt_computed(config):
    from paged_bench.core.request import Request
    from paged_bench.run.bench import build_engine

    engine, _ = build_engine(config("max_batch=2"))
    sched = engine.scheduler
    reqs = [Request(i, 0.0, list(range(40)), 5) for i in range(3)]
    for r in reqs:
        r.token_ids.append(7)  # the first token, sampled on the prefill replica
    assert sched.add_prefilled(reqs[0], 0.0) and sched.add_prefilled(reqs[1], 0.0)
    assert not sched.add_prefilled(reqs[2], 0.0)  # max_batch
    plan = sched.schedule(0.0)
    assert [new.req_id for new in plan.new_reqs] == [0, 1]
    assert all(new.num_computed_tokens == 40 for new in plan.new_reqs)
    assert plan.num_new_tokens == (1, 1) and plan.num_computed_tokens == (40, 40)
    assert sched.schedule(0.0).new_reqs == ()  # sent once


def test_a_static_decode_replica_seats_hand_overs_only_into_an_empty_batch(config, tmp_path):
    """The policy's admission rule holds for hand-overs too: static and continuous gave
    byte-identical runs on a split cluster, the static batch growing while it ran."""
    base = ("cluster.prefill_replicas=1", "cluster.decode_replicas=1", "max_batch=4", "tracking.enabled=false")
    static = run_job(config(*base, "scheduler=static"), tmp_path / "static")
    continuous = run_job(config(*base, "scheduler=continuous"), tmp_path / "continuous")
    decode = [r for r in _rows(tmp_path / "static" / "steps.csv") if r["replica"] == "1"]
    for before, step in itertools.pairwise(decode):
        if int(step["batch_size"]) > int(before["running"]):  # someone was seated
            assert int(before["running"]) == 0, (before, step)
    assert static.summary["median_e2el_ms"] > 2 * continuous.summary["median_e2el_ms"]


def test_a_model_backend_is_refused_for_a_split_cluster_before_it_loads(config, tmp_path):
    """No K/V is copied between replicas (the transfer is priced): a numpy decode replica read
    blocks that were never written and sampled wrong tokens, silently."""
    from paged_bench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"cluster.prefill_replicas=1 is not allowed: 0 with backend=numpy"):
        run_job(config(*SPLIT, "backend=numpy", "clock=virtual"), tmp_path)


def test_an_interrupt_mid_step_leaves_every_replica_whole(config, monkeypatch):
    """Ctrl-C inside a step, after a finished request left the running list and before its
    blocks were freed (here: the 5th free of either replica raises it): the cluster frees what is held, as the
    plain engine does, instead of reporting a leak."""
    from paged_bench.cluster.cluster_bench import build_cluster
    from paged_bench.cluster.spec import cluster_spec
    from paged_bench.core.kv.paged import PagedAllocator
    from paged_bench.run import registry

    calls = []

    class InterruptedFree(PagedAllocator):  # an override: the compiled core calls its own methods
        def free(self, req):
            calls.append(req)
            if len(calls) == 5:
                raise KeyboardInterrupt
            super().free(req)

    load = registry.load
    monkeypatch.setattr(registry, "load", lambda kind, name: InterruptedFree if kind == "allocator" else load(kind, name))  # fmt: skip
    cfg = config("cluster.replicas=2", "tracking.enabled=false")
    bench = build_cluster(cfg, cluster_spec(cfg))
    run = bench.cluster.run(bench.requests)
    assert run.interrupted and len(calls) >= 5
    assert [r.leaks for r in run.results] == [[], []]


SUMMED = ("completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
          "output_throughput", "total_token_throughput")  # fmt: skip


@pytest.mark.parametrize("cluster", [SPLIT[:2], ("cluster.replicas=3",)])
def test_each_replica_counts_its_share_so_the_rows_add_up_to_the_cluster(config, tmp_path, cluster):
    # a split cluster's rows counted every request twice (the prefill copy and the original),
    # a decode replica its prompt and first token again; each divided by its own duration
    outcome = run_job(config(*cluster, *SPLIT[2:], "workload.rate=40", "slo.ttft_ms=200"), tmp_path)
    s, rows = outcome.summary, _rows(tmp_path / "replicas.csv")
    for key in SUMMED:
        assert sum(float(r[key]) for r in rows) == pytest.approx(s[key]), key
    assert {float(r["duration"]) for r in rows} == {s["duration"]}
    if cluster == SPLIT[:2]:
        prefill, *decode = rows
        assert int(prefill["prefilled"]) == 120 and prefill["median_ttft_ms"] and not prefill["median_itl_ms"]
        assert all(not r["median_ttft_ms"] and r["median_itl_ms"] and not r["goodput"] for r in decode)
        assert s["decode_load_imbalance"] == max(int(r["completed"]) for r in decode) / 60


def test_a_tensor_parallel_replica_sends_its_kv_over_a_link_per_rank(config, tmp_path):
    def mean_transfer(tp):
        overrides = (*SPLIT[:2], "workload.num_requests=20", "backend.cost_model=roofline",
                     f"backend.tensor_parallel_size={tp}", "tracking.enabled=false")  # fmt: skip
        return run_job(config(*overrides), tmp_path / str(tp)).summary

    one, eight = mean_transfer(1), mean_transfer(8)
    assert eight["kv_transfer_bytes"] == one["kv_transfer_bytes"]
    latency_ms = LINKS["nvlink4"].latency * 1e3
    assert eight["mean_kv_transfer_ms"] - latency_ms == pytest.approx((one["mean_kv_transfer_ms"] - latency_ms) / 8)
