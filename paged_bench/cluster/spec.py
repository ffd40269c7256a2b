"""The ``cluster`` config section: how many replicas, in which roles, over which link.

    cluster.replicas=N                                    N colocated replicas behind the router
    cluster.prefill_replicas=P cluster.decode_replicas=D  P prefill + D decode replicas
    cluster.replicas=4 cluster.prefill_replicas=1         the same, D = replicas - P

When split, ``replicas`` is P + D: leave it at its default (1, or null) or say P + D. One
colocated replica is no cluster at all: the plain engine runs, its outputs exactly as
without this section, and a ``router`` other than the default is refused (nothing to route).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paged_bench.cluster.link import Link, make_link
from paged_bench.errors import ConfigError, check, check_int
from paged_bench.run import registry
from paged_bench.run.config import plugin_section

DEFAULT_ROUTER = "round_robin"
KEYS = ("replicas", "prefill_replicas", "decode_replicas", "link", "link_bandwidth_gbs", "link_latency_us")


@dataclass(frozen=True)
class ClusterSpec:
    num_prefill: int  # 0 = colocated: every replica prefills and decodes
    num_decode: int  # colocated: the number of replicas
    link: Link

    @property
    def disaggregated(self) -> bool:
        return self.num_prefill > 0

    @property
    def num_replicas(self) -> int:
        return self.num_prefill + self.num_decode


def cluster_spec(cfg: Mapping[str, Any]) -> ClusterSpec | None:
    """The cluster a config asks for, or None for a single engine (no section, or 1 replica).
    A single engine has nothing to route: a router chosen for it is refused here, before any
    engine is built (it ran, its settings unchecked, as if it had been round robin)."""
    spec = _spec(cfg)
    if spec is None:
        _check_no_router(cfg)
    return spec


def router_choice(cfg: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The ``router`` group's option and its settings (``round_robin`` when none is chosen)."""
    return plugin_section(cfg, "router") if cfg.get("router") is not None else (DEFAULT_ROUTER, {})


def _check_no_router(cfg: Mapping[str, Any]) -> None:
    """A router on one engine: refused where ``cluster.replicas`` was left unset (a forgotten
    cluster, most likely), taken (unused) where it was given as 1 (a sweep from one replica up)."""
    name, options = router_choice(cfg)
    if name != DEFAULT_ROUTER and (cfg.get("cluster") or {}).get("replicas") is None:
        raise ConfigError("router", name, f"{DEFAULT_ROUTER} (the default) with one replica: a router needs "
                                          "two or more replicas")  # fmt: skip
    registry.create("router", name, **options)  # its settings are checked all the same


def unused_router_note(cfg: Mapping[str, Any]) -> str | None:
    """What to say of a router chosen for a config that runs one engine (``cluster_spec`` is
    None: ``cluster.replicas=1``, given): it routes nothing."""
    name, _ = router_choice(cfg)
    if name == DEFAULT_ROUTER:
        return None
    return f"note: router={name} has one replica to route to (cluster.replicas=1): the engine runs alone"


def _spec(cfg: Mapping[str, Any]) -> ClusterSpec | None:
    section = cfg.get("cluster")
    if section is None:
        return None
    check(isinstance(section, Mapping), "cluster", section, f"a mapping with keys {', '.join(KEYS)}")
    for key in section:
        check(key in KEYS, f"cluster.{key}", section[key], f"one of {', '.join(KEYS)}")
    replicas, prefill, decode = (section.get(k) for k in ("replicas", "prefill_replicas", "decode_replicas"))
    replicas = None if replicas is None else check_int("cluster.replicas", replicas)
    # only null is unset: '', false, [] and {} were read as 0 (a colocated cluster, unasked)
    prefill = 0 if prefill is None else check_int("cluster.prefill_replicas", prefill, 0)
    link = make_link(section.get("link", "nvlink4"), section.get("link_bandwidth_gbs"), section.get("link_latency_us"))
    if prefill == 0:
        check(decode is None or (check_int("cluster.decode_replicas", decode, 0) == 0), "cluster.decode_replicas",
              decode, "0 or null unless cluster.prefill_replicas is set")  # fmt: skip
        return None if (replicas or 1) == 1 else ClusterSpec(0, replicas, link)
    if decode is None:
        check(replicas is not None and replicas > max(prefill, 1), "cluster.replicas", replicas,
              f"more than cluster.prefill_replicas={prefill}, or set cluster.decode_replicas")  # fmt: skip
        decode = replicas - prefill
    decode = check_int("cluster.decode_replicas", decode)
    check(replicas in (None, 1, prefill + decode), "cluster.replicas", replicas,
          f"1 (the default) or prefill_replicas + decode_replicas = {prefill + decode}")  # fmt: skip
    return ClusterSpec(prefill, decode, link)
