"""The deployments a plan weighs: its search space (``plan.space``) read and checked, each
candidate's overrides of the run config, and what it costs an hour (``plan.prices``).

A candidate is one GPU type (a roofline hardware preset) at one tensor-parallel degree, as
colocated replicas or as a prefill/decode split (``"P+D"``), with one ``max_batch``,
``max_num_batched_tokens`` and router. Its overrides are what ``python -m paged_bench`` takes,
so the winner's command line is the candidate's overrides on the plan's own.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from paged_bench.costmodel.roofline import HARDWARE
from paged_bench.errors import ConfigError, check, check_int, check_number

# the search space's axes, in the order a candidate's label reads them
AXES = ("hardware", "tensor_parallel_size", "replicas", "prefill_decode", "max_batch", "max_num_batched_tokens",
        "router")  # fmt: skip


@dataclass(frozen=True)
class Price:
    usd_per_gpu_hour: float
    source: str
    date: str


@dataclass(frozen=True)
class Candidate:
    """One deployment. ``prefill`` > 0: disaggregated, ``prefill`` + ``decode`` replicas;
    else ``decode`` colocated replicas."""

    hardware: str
    tensor_parallel_size: int
    prefill: int
    decode: int
    max_batch: int
    max_num_batched_tokens: int
    router: str
    usd_per_gpu_hour: float

    @property
    def num_replicas(self) -> int:
        return self.prefill + self.decode

    @property
    def num_gpus(self) -> int:
        return self.num_replicas * self.tensor_parallel_size

    @property
    def usd_per_hour(self) -> float:
        return self.num_gpus * self.usd_per_gpu_hour

    @property
    def family(self) -> tuple[Any, ...]:
        """What it shares with the candidates whose capacity scales with its ``size``: all but
        the number of colocated replicas, or of a split's prefill replicas."""
        return (self.hardware, self.tensor_parallel_size, self.max_batch, self.max_num_batched_tokens, self.router,
                self.decode if self.prefill else None)  # fmt: skip

    @property
    def size(self) -> int:
        """The replicas its capacity grows with, about in proportion: the colocated ones (a router
        spreads the load), or a split's prefill ones (prefill binds a split's TTFT)."""
        return self.prefill or self.decode

    @property
    def split(self) -> str:
        return f"{self.prefill}P+{self.decode}D" if self.prefill else f"{self.decode}x"

    @property
    def label(self) -> str:
        return (f"{self.hardware} TP{self.tensor_parallel_size} {self.split} batch {self.max_batch} "
                f"tokens {self.max_num_batched_tokens} {self.router}")  # fmt: skip

    def engine_overrides(self) -> list[str]:
        """What sizes one replica's engine (its pool, its weights): shared by all its splits."""
        return [f"backend.hardware={self.hardware}", f"backend.tensor_parallel_size={self.tensor_parallel_size}",
                f"max_batch={self.max_batch}", f"max_num_batched_tokens={self.max_num_batched_tokens}"]  # fmt: skip

    def overrides(self) -> list[str]:
        """The candidate as ``python -m paged_bench`` overrides."""
        if self.prefill:
            cluster = [f"cluster.prefill_replicas={self.prefill}", f"cluster.decode_replicas={self.decode}"]
        else:
            cluster = [f"cluster.replicas={self.decode}"]
        return [*self.engine_overrides(), *cluster, f"router={self.router}"]

    def params(self) -> dict[str, Any]:
        """What MLflow and the table record of it."""
        return {"hardware": self.hardware, "tensor_parallel_size": self.tensor_parallel_size, "split": self.split,
                "num_gpus": self.num_gpus, "max_batch": self.max_batch,
                "max_num_batched_tokens": self.max_num_batched_tokens, "router": self.router,
                "usd_per_gpu_hour": self.usd_per_gpu_hour}  # fmt: skip


def _axis(space: Mapping[str, Any], key: str) -> list[Any]:
    values = space.get(key)
    if values is None or isinstance(values, (str, int)):
        values = [] if values is None else [values]
    check(isinstance(values, Sequence), f"plan.space.{key}", values, "a list")
    return list(values)


def _split(value: Any) -> tuple[int, int]:
    """``"P+D"``: P prefill and D decode replicas."""
    parts = str(value).split("+")
    allowed = 'a split "P+D", P prefill and D decode replicas, each an integer >= 1 (e.g. "1+2")'
    check(len(parts) == 2 and all(p.strip().isdigit() and int(p) >= 1 for p in parts), "plan.space.prefill_decode",
          value, allowed)  # fmt: skip
    return int(parts[0]), int(parts[1])


def read_prices(prices: Mapping[str, Any], hardware: Sequence[str]) -> dict[str, Price]:
    """The price of each GPU type the space uses; one line naming the first that has none."""
    out = {}
    for name in hardware:
        entry = prices.get(name)
        key = f"plan.prices.{name}.usd_per_gpu_hour"
        if not isinstance(entry, Mapping) or entry.get("usd_per_gpu_hour") is None:
            known = ", ".join(sorted(prices)) or "none"
            raise ConfigError(key, None, f"a price in $/GPU-hour for every GPU type in plan.space.hardware (priced: "
                                         f"{known}; add one with +{key}=N)")  # fmt: skip
        usd = check_number(key, entry["usd_per_gpu_hour"], 0, strict=True)
        out[name] = Price(usd, str(entry.get("source") or "given"), str(entry.get("date") or "n/a"))
    return out


def candidates(space: Mapping[str, Any], prices: Mapping[str, Any]) -> list[Candidate]:
    """Every combination the space names, cheapest first (ties: fewer GPUs, then as listed).
    ConfigError for an unknown GPU type, a GPU with no price, a bad value, or an empty space."""
    unknown = set(space) - set(AXES)
    if unknown:
        key = min(unknown)
        raise ConfigError(f"plan.space.{key}", space[key], f"one of the axes {', '.join(AXES)}")
    axes = {key: _axis(space, key) for key in AXES}
    for name in axes["hardware"]:
        check(name in HARDWARE, "plan.space.hardware", name,
              f"roofline hardware presets: {', '.join(HARDWARE)} (paged_bench/costmodel/roofline.py)")  # fmt: skip
    for key in ("tensor_parallel_size", "replicas", "max_batch", "max_num_batched_tokens"):
        for value in axes[key]:
            check_int(f"plan.space.{key}", value)
    splits = [(0, r) for r in axes["replicas"]] + [_split(v) for v in axes["prefill_decode"]]
    empty = [k for k in ("hardware", "tensor_parallel_size", "max_batch", "max_num_batched_tokens", "router")
             if not axes[k]]  # fmt: skip
    if empty or not splits:
        key = empty[0] if empty else "replicas"
        raise ConfigError(f"plan.space.{key}", axes[key],
                          "a non-empty list: the search space has no candidates (replicas or prefill_decode "
                          "needs one entry between them)")  # fmt: skip
    priced = read_prices(prices, axes["hardware"])
    out = [
        Candidate(hw, tp, p, d, mb, mnbt, router, priced[hw].usd_per_gpu_hour)
        for hw, tp, (p, d), mb, mnbt, router in itertools.product(
            axes["hardware"],
            axes["tensor_parallel_size"],
            splits,
            axes["max_batch"],
            axes["max_num_batched_tokens"],
            axes["router"],
        )
    ]
    return sorted(dict.fromkeys(out), key=lambda c: (c.usd_per_hour, c.num_gpus))
