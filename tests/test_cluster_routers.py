"""Each router's choice over hand-made replica views: what its docstring promises."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from paged_bench.core.request import Request
from paged_bench.errors import ConfigError
from paged_bench.routers.base import ReplicaView
from paged_bench.run import registry


@dataclass
class FakeView(ReplicaView):
    index: int
    num_in_flight: int = 0
    num_free_blocks: int = 100
    num_blocks: int = 100
    cached: dict = field(default_factory=dict)  # request id -> cached prefix tokens

    def cached_prefix_tokens(self, req):
        return self.cached.get(req.request_id, 0)


def views(*loads, **kw):
    return [FakeView(i, n, **kw) for i, n in enumerate(loads)]


def req(i=0, tokens=None):
    return Request(i, 0.0, tokens or list(range(i * 1000, i * 1000 + 100)), 8)


def test_round_robin_cycles_whatever_the_load():
    router = registry.create("router", "round_robin")
    assert [router.route(req(), views(9, 0, 0)) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_takes_the_shortest_queue_lowest_index_on_ties():
    router = registry.create("router", "least_outstanding")
    assert router.route(req(), views(3, 1, 2)) == 1
    assert router.route(req(), views(2, 1, 1)) == 1


def test_least_kv_takes_the_most_free_blocks_then_the_shortest_queue():
    router = registry.create("router", "least_kv")
    vs = views(0, 5, 5)
    vs[1].num_free_blocks, vs[2].num_free_blocks = 90, 90
    vs[0].num_free_blocks = 10
    assert router.route(req(), vs) == 1  # 1 and 2 tie on free blocks and load: the lower index
    vs[1].num_in_flight = 6
    assert router.route(req(), vs) == 2


def test_power_of_two_never_picks_the_busier_of_its_two_and_spreads():
    router = registry.create("router", "power_of_two", seed=3)
    vs = views(5, 0, 1, 9)
    picks = [router.route(req(), vs) for _ in range(200)]
    assert 3 not in picks  # the busiest replica loses every pair it is drawn in
    assert set(picks) == {0, 1, 2}  # replica 0 still wins its pair against 3
    # equal load: every replica as likely (ties went to the lower index: the last one never won)
    idle = [router.route(req(), views(0, 0, 0, 0)) for _ in range(4000)]
    assert all(900 < idle.count(i) < 1100 for i in range(4)), [idle.count(i) for i in range(4)]


def test_prefix_affinity_follows_the_cache_within_the_imbalance_and_remembers_bursts():
    router = registry.create("router", "prefix_affinity", max_imbalance=2)
    r = req(1)
    vs = views(2, 0, 1)
    vs[0].cached[1] = 64
    assert router.route(r, vs) == 0  # holds the prefix, 2 more in flight than the least loaded: allowed
    vs[0].num_in_flight = 3
    assert router.route(r, vs) == 1  # 3 more: too busy, the least loaded instead
    # a burst of the same prompt, cached nowhere yet: the router's own memory keeps it together
    burst = [req(7, list(range(500))) for _ in range(3)]
    fresh = views(0, 0, 0)
    first = router.route(burst[0], fresh)
    fresh[first].num_in_flight = 1
    assert [router.route(b, fresh) for b in burst[1:]] == [first, first]


def test_prefix_affinity_ignores_a_cached_prefix_below_the_threshold():
    """SGLang's cache_threshold: a replica holding one shared block of a long prompt is no
    reason to send it there; above the threshold the cache wins over load."""
    router = registry.create("router", "prefix_affinity", cache_threshold=0.3)
    long_prompt = req(2, list(range(2000, 2200)))  # 200 tokens
    vs = views(1, 0)
    vs[0].cached[2] = 48  # 24% of the prompt: not enough, the less loaded replica takes it
    assert router.route(long_prompt, vs) == 1
    vs[0].cached[2] = 64  # 32%: follows the cache (a new router: this one remembers sending it to 1)
    assert registry.create("router", "prefix_affinity", cache_threshold=0.3).route(long_prompt, vs) == 0
    # the threshold at 0 follows any cached prefix, as before it existed
    assert registry.create("router", "prefix_affinity", cache_threshold=0).route(req(3), views(1, 0)) == 1
    anything = views(1, 0)
    anything[0].cached[3] = 16
    assert registry.create("router", "prefix_affinity", cache_threshold=0).route(req(3), anything) == 0


def test_router_options_are_checked():
    with pytest.raises(ConfigError, match="router.max_imbalance"):
        registry.create("router", "prefix_affinity", max_imbalance=-1)
    for bad in (1, 1.5, -0.1, "x"):
        with pytest.raises(ConfigError, match="router.cache_threshold"):
            registry.create("router", "prefix_affinity", cache_threshold=bad)
    with pytest.raises(ConfigError, match="router.seed"):
        registry.create("router", "power_of_two", seed="x")
    with pytest.raises(ConfigError, match="round_robin' takes no options"):
        registry.create("router", "round_robin", seed=1)
