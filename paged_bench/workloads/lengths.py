"""Token-length distributions for synthetic workloads, built from a ``{dist: ..., ...}`` spec.

- ``fixed``: ``value``
- ``uniform``: integers in ``[low, high]``
- ``lognormal``: ``mean`` (of the lengths) and ``sigma`` (of their log), clipped to ``[min, max]``.
  ``mean`` is the mean before clipping: the median is ``mean * exp(-sigma**2 / 2)``, so a wide
  sigma puts many lengths near ``min`` and a few far out, which ``max`` clips: mean 64, sigma
  2.5, max 256 has a median of 3 (40% are 1) and a mean of about 25. ``sigma`` is at most 5.
- ``heavy_tail``: the seeds' mix: ``long_fraction`` of requests near ``long``, the rest near
  ``short``, each spread uniformly by +-``spread`` (a fraction of the centre)
- ``sharegpt`` (no keys; for ``prompt_len`` and ``output_len`` together): ShareGPT's prompt and
  completion lengths in Llama 3 tokens, pairs drawn as vLLM's benchmark draws them
  (``workloads.sharegpt``); a synthetic workload draws the pair of each request at once
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from paged_bench.errors import MAX_TOKENS, ConfigError, check, check_int, check_number
from paged_bench.workloads.sharegpt import sharegpt_means, sharegpt_sample

MAX_SIGMA = 5  # of a lognormal's log: past it, the lengths are its min or max and nothing between


class LengthDist:
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    @property
    def expected(self) -> float:
        """The lengths' expected value (before any clipping): what a workload's size is judged by."""
        raise NotImplementedError


@dataclass(frozen=True)
class Fixed(LengthDist):
    value: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    @property
    def expected(self) -> float:
        return float(self.value)


@dataclass(frozen=True)
class Uniform(LengthDist):
    low: int
    high: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n)

    @property
    def expected(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class LogNormal(LengthDist):
    mean: float
    sigma: float
    min: int = 1
    max: int | None = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.mean) - self.sigma**2 / 2  # so that E[length] == mean
        # clipped as floats: a wide sigma draws values past int64, which would wrap to negative
        values = np.clip(rng.lognormal(mu, self.sigma, size=n), self.min, self.max or MAX_TOKENS)
        return np.rint(values).astype(np.int64)

    @property
    def expected(self) -> float:
        return self.mean


@dataclass(frozen=True)
class HeavyTail(LengthDist):
    short: int = 24
    long: int = 150
    long_fraction: float = 0.2
    spread: float = 0.25

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        centre = np.where(rng.random(n) < self.long_fraction, self.long, self.short)
        jitter = rng.uniform(-self.spread, self.spread, size=n)
        return np.maximum(1, np.rint(centre * (1 + jitter))).astype(np.int64)

    @property
    def expected(self) -> float:
        return self.long_fraction * self.long + (1 - self.long_fraction) * self.short


@dataclass(frozen=True)
class ShareGPT(LengthDist):
    """One column of vLLM's ShareGPT pairs (0: prompts, 1: outputs). Drawn alone, a column is
    that column of ``n`` pairs; a synthetic workload draws the pairs once for both columns."""

    column: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return sharegpt_sample(n, rng)[:, self.column].copy()

    @property
    def expected(self) -> float:
        return sharegpt_means()[self.column]


def _sharegpt(key: str) -> LengthDist:
    return ShareGPT(1 if key.endswith("output_len") else 0)


def _fixed(key: str, value: Any) -> LengthDist:
    return Fixed(check_int(f"{key}.value", value, 1, MAX_TOKENS))


def _upper(key: str, value: Any, lower: str, least: int, also: str = "") -> None:
    """``value`` is an integer from ``least`` (the bound named ``lower``) to MAX_TOKENS (a bool is
    not one: ``high: true`` was read as 1)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and least <= value <= MAX_TOKENS
    check(ok, key, value, f"an integer from {lower}={least} to {MAX_TOKENS:,}{also}")


def _uniform(key: str, low: Any, high: Any) -> LengthDist:
    check_int(f"{key}.low", low, 1, MAX_TOKENS)
    _upper(f"{key}.high", high, "low", low)
    return Uniform(low, high)


def _lognormal(key: str, mean: Any, sigma: Any = 0.5, min: Any = 1, max: Any = None) -> LengthDist:
    check_number(f"{key}.mean", mean, 1)
    check(mean <= MAX_TOKENS, f"{key}.mean", mean, f"a number from 1 to {MAX_TOKENS:,}")
    check_int(f"{key}.min", min, 1, MAX_TOKENS)
    # past 5 the median, mean * exp(-sigma**2 / 2), is under a millionth of the mean: the lengths
    # are min or max and nothing between (and 1e200 overflowed the sampler)
    check(isinstance(sigma, (int, float)) and not isinstance(sigma, bool) and 0 <= sigma <= MAX_SIGMA,
          f"{key}.sigma", sigma, f"a number from 0 to {MAX_SIGMA} (wider, nearly every length is min or max)")  # fmt: skip
    if max is not None:
        _upper(f"{key}.max", max, "min", min, ", or null")
    return LogNormal(float(mean), float(sigma), min, max)


def _heavy_tail(key: str, short: Any = 24, long: Any = 150, long_fraction: Any = 0.2, spread: Any = 0.25) -> LengthDist:
    check_int(f"{key}.short", short, 1, MAX_TOKENS)
    check_int(f"{key}.long", long, 1, MAX_TOKENS)
    check_number(f"{key}.long_fraction", long_fraction)
    check(long_fraction <= 1, f"{key}.long_fraction", long_fraction, "a fraction in [0, 1]")
    check_number(f"{key}.spread", spread)
    check(spread < 1, f"{key}.spread", spread, "a fraction in [0, 1)")
    return HeavyTail(short, long, float(long_fraction), float(spread))


_BUILDERS = {"fixed": _fixed, "uniform": _uniform, "lognormal": _lognormal, "heavy_tail": _heavy_tail,
             "sharegpt": _sharegpt}  # fmt: skip


def length_dist(key: str, spec: Mapping[str, Any] | int) -> LengthDist:
    """Build a distribution from its spec; a bare integer means ``fixed``."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return _fixed(key, spec)
    if not isinstance(spec, Mapping) or "dist" not in spec:
        raise ConfigError(key, spec, f"an integer or a mapping with dist: one of {', '.join(_BUILDERS)}")
    params = dict(spec)
    dist = params.pop("dist")
    builder = _BUILDERS.get(dist)
    check(builder is not None, f"{key}.dist", dist, f"one of {', '.join(_BUILDERS)}")
    try:
        return builder(key, **params)
    except TypeError:
        allowed = [p for p in builder.__code__.co_varnames[1 : builder.__code__.co_argcount]]
        unknown = sorted(set(params) - set(allowed))
        if not unknown:
            raise ConfigError(f"{key}.dist", dist, f"{dist} with its keys: {', '.join(allowed)}") from None
        # keys left over from the distribution it replaces (prompt_len.dist=fixed keeps uniform's low/high)
        raise ConfigError(f"{key}.{unknown[0]}", params[unknown[0]],
                          f"no key of dist={dist}, which takes {', '.join(allowed) or 'no keys'}; to switch "
                          f"distributions on the command line, drop the old keys: '~{key}' "
                          f"'+{key}={{dist:{dist},...}}' (a fixed length: {key}=N)") from None  # fmt: skip
