"""Turning a row of logits into a token: greedy, or temperature with nucleus (top-p) sampling.

A request with a ``sampling_seed`` draws from a generator seeded by (seed, position), so its
tokens do not depend on which other requests shared its steps; others draw from the
backend's generator, seeded by the run's seed.
"""

from __future__ import annotations

import numpy as np

from paged_bench.step import SamplingParams


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        sorted_p = p[order]
        # the smallest set of most likely tokens whose mass reaches top_p (at least one)
        keep = order[(np.cumsum(sorted_p) - sorted_p) < top_p]
        kept = p[keep] / p[keep].sum()
        return int(keep[rng.choice(len(keep), p=kept)])
    return int(rng.choice(len(p), p=p))


def request_rng(sampling: SamplingParams, num_tokens: int, default: np.random.Generator) -> np.random.Generator:
    """The generator for a request's next token, drawn when it holds ``num_tokens`` tokens."""
    if sampling.seed is None:
        return default
    return np.random.default_rng((sampling.seed, num_tokens))


def is_greedy(sampling: SamplingParams) -> bool:
    return sampling.temperature <= 0
