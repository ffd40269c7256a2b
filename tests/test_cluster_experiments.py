"""The cluster experiments of the registry show what their questions ask about, on the sim."""

from __future__ import annotations

from tests.test_experiments import results

ROUTERS = ("round_robin", "least_outstanding", "least_kv", "power_of_two", "prefix_affinity")


def test_routing_on_the_azure_trace_least_outstanding_beats_round_robin_and_nobody_hits():
    r = {name: results("routing")[f"router={name}"] for name in ROUTERS}
    assert all(s["completed"] == 4000 and s["num_replicas"] == 4 for s in r.values())
    assert r["least_outstanding"]["p99_ttft_ms"] < 0.95 * r["round_robin"]["p99_ttft_ms"]
    assert max(r["least_kv"]["p99_ttft_ms"], r["round_robin"]["p99_ttft_ms"]) == r["least_kv"]["p99_ttft_ms"]
    # sizes-only trace: no shared prefixes, so affinity has nothing to follow and falls back to load
    assert all(s["prefix_cache_hit_rate"] < 0.01 for s in r.values())
    assert r["prefix_affinity"]["p99_ttft_ms"] == r["least_outstanding"]["p99_ttft_ms"]


def test_routing_prefix_affinity_hits_most_and_least_outstanding_beats_round_robin():
    r = {name: results("routing_prefix")[f"router={name}"] for name in ROUTERS}
    assert all(s["completed"] == 800 and s["num_replicas"] == 4 for s in r.values())
    hits = {name: s["prefix_cache_hit_rate"] for name, s in r.items()}
    assert max(hits, key=hits.get) == "prefix_affinity" and hits["prefix_affinity"] > 2 * hits["round_robin"]
    p99 = {name: s["p99_ttft_ms"] for name, s in r.items()}
    assert min(p99, key=p99.get) == "prefix_affinity"
    assert p99["least_outstanding"] < p99["round_robin"]


def test_disaggregation_split_cuts_the_itl_tail_and_the_wrong_ratio_queues_a_phase():
    r = {p: results("disaggregation")[f"cluster.prefill_replicas={p}"] for p in (0, 1, 2, 3)}
    colocated, one, two, three = r[0], r[1], r[2], r[3]
    assert all(s["completed"] == 4000 and s["num_replicas"] == 4 for s in r.values())
    assert "kv_transfer_bytes" not in colocated and two["kv_transfer_bytes"] > 0
    assert two["p99_itl_ms"] < colocated["p99_itl_ms"] / 3  # no prefill chunks in decode batches
    assert one["median_ttft_ms"] > 10 * colocated["median_ttft_ms"]  # one prefill replica: prompts queue
    assert three["median_itl_ms"] > two["median_itl_ms"]  # one decode replica: fuller decode batches
    assert two["goodput"] > max(colocated["goodput"], one["goodput"], three["goodput"])
