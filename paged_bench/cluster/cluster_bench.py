"""From a resolved config with a ``cluster`` section to a cluster ready to run.

Every replica is built by the single-engine build path from the same typed config, read
once (its own scheduler, pool and backend); the workload is built once. The router is the ``router``
config group's option (``round_robin`` when none is chosen); a disaggregated cluster has
one router object for arrivals (over the prefill replicas) and one for hand-overs (over the
decode replicas).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from paged_bench.cluster.loop import Cluster
from paged_bench.cluster.replica import Replica
from paged_bench.cluster.spec import ClusterSpec, router_choice
from paged_bench.core.engine import Engine
from paged_bench.core.request import Request
from paged_bench.errors import ConfigError, check
from paged_bench.model.config import DTYPE_BYTES, resolve_model
from paged_bench.routers.base import Router
from paged_bench.run import registry
from paged_bench.run.bench import build_engine, build_workload, typed, workload_requests
from paged_bench.run.config import BenchConfig
from paged_bench.sizing.kv_capacity import KVBudget


@dataclass
class ClusterBench:
    cluster: Cluster
    requests: list[Request]
    spec: ClusterSpec
    choices: dict[str, str]  # plugin kind -> option name, the router's included
    kv_budget: KVBudget | None  # how num_blocks=auto sized each replica's pool

    @property
    def num_gpus(self) -> int:
        return sum(replica.engine.backend.num_devices for replica in self.cluster.replicas)


def _kv_bytes_per_token(config: BenchConfig, engine: Engine) -> int:
    """What one token's K/V weighs on the link: the backend's model, else the sim's ``model``."""
    if engine.backend.kv_bytes_per_token is not None:
        return engine.backend.kv_bytes_per_token
    backend = config.plugins["backend"]
    model, model_path, dtype = (backend.options.get(key) for key in ("model", "model_path", "dtype"))
    # with neither, resolve_model's default is the tiny test model: transfers 64x too cheap
    check(model is not None or model_path is not None, "backend", backend.name,
          "a backend whose K/V size is known: one that sets kv_bytes_per_token, or takes a model or model_path "
          "option")  # fmt: skip
    shape = resolve_model(model, model_path)
    check(dtype is None or dtype in DTYPE_BYTES, "backend.dtype", dtype, ", ".join(DTYPE_BYTES))
    return shape.kv_bytes_per_token(dtype)


def _check_backend(config: BenchConfig, spec: ClusterSpec) -> None:
    """Before any replica is built (a real model loads once per replica): one simulated
    timeline needs a virtual clock, and a hand-over needs K/V that need not be copied (the
    cluster prices the transfer; it does not move a real model's K/V)."""
    name, backend = config.plugins["backend"].name, config.plugins["backend"].plugin
    clock = config.run.clock
    if clock == "auto":
        check(backend.clock == "virtual", "backend", name, f"a backend on virtual time for {spec.num_replicas} replicas "
              "(backend=sim, or clock=virtual): replicas share one simulated timeline")  # fmt: skip
    else:
        check(clock == "virtual", "clock", clock, f"virtual for {spec.num_replicas} replicas: they share one "
              "simulated timeline")  # fmt: skip
    if spec.disaggregated:
        check(not backend.computes_kv, "cluster.prefill_replicas", spec.num_prefill,
              f"0 with backend={name}: a hand-over prices the K/V transfer but copies no K/V, so a model's "
              "decode replica would attend over blocks never written (disaggregate backend=sim, or a cost-model "
              "backend plugin, which sets computes_kv = False)")  # fmt: skip


def build_cluster(cfg: BenchConfig | Mapping[str, Any], spec: ClusterSpec) -> ClusterBench:
    """The cluster ``spec`` describes, each replica built from the same config, read once."""
    config = typed(cfg)
    choices = config.choices
    router_name, router_options = router_choice(config.source)
    choices["router"] = router_name
    _check_backend(config, spec)
    # the first replica's memory check counts every replica's pool; each later one's counts
    # itself alone (the memory then free already lacks the ones built): N copies checked
    # against what N-1 left refused a cluster that fit, after minutes of building replicas
    built = [build_engine(config, copies=spec.num_replicas if i == 0 else 1) for i in range(spec.num_replicas)]
    engines = [engine for engine, _ in built]
    if spec.disaggregated:
        roles = ["prefill"] * spec.num_prefill + ["decode"] * spec.num_decode
    else:
        roles = ["colocated"] * spec.num_decode
    replicas = [Replica(i, role, engine) for i, (role, engine) in enumerate(zip(roles, engines))]

    def router(role: str = "colocated") -> Router:
        options = dict(router_options)
        if role == "decode" and isinstance(options.get("seed"), int) and options["seed"] >= 0:
            # a stream of its own: with the prefill router's seed, both drew the same pairs
            options["seed"] = int(np.random.SeedSequence([options["seed"], 1]).generate_state(1)[0])
        return registry.create("router", router_name, **options)

    if spec.disaggregated:
        try:
            kv_bytes = _kv_bytes_per_token(config, engines[0])
        except ConfigError as e:
            raise ConfigError(e.key, e.value, f"{e.allowed} (the K/V size prices a hand-over's transfer)") from e
        cluster = Cluster(replicas, router("prefill"), router("decode"), spec.link, kv_bytes)
    else:
        cluster = Cluster(replicas, router())
    _, kv_budget = built[0]
    workload = build_workload(config)
    check(workload.max_concurrency is None, "workload.max_concurrency", workload.max_concurrency,
          "null in a cluster run (arrivals are replayed open-loop at their times)")  # fmt: skip
    return ClusterBench(cluster, workload_requests(workload, engines[0].backend), spec, choices, kv_budget)
