"""Turning a row of logits into a token: greedy, or temperature with nucleus (top-p) sampling.

A request with a ``seed`` draws from a generator seeded by (seed, position), so its tokens do
not depend on which other requests shared its steps; others draw from the backend's
generator, seeded by the run's seed. Any 64-bit seed works (a negative one is taken modulo
2**64), and a temperature below ``GREEDY_BELOW`` samples greedily, as vLLM does.

``sample_batch`` guards each request's sampling on its own: given a ``failures`` list (the
server passes one), a request whose sampling raises is noted there (its id and the error)
and gets the greedy token as a placeholder, so the engine can end that request alone;
without one, the error propagates as before (a benchmark run must not go on with made-up
tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from paged_bench.core.plan import ReqId, SamplingParams

GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS
_SEED_SPACE = 2**64


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    if temperature < GREEDY_BELOW:
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
    return np.random.default_rng((sampling.seed % _SEED_SPACE, num_tokens))


def is_greedy(sampling: SamplingParams) -> bool:
    return sampling.temperature < GREEDY_BELOW


def sample_batch(
    rows: np.ndarray, req_ids: Sequence[ReqId], samplings: Sequence[SamplingParams], num_tokens: Sequence[int],
    default: np.random.Generator, failures: list[tuple[ReqId, str]] | None = None,
) -> list[int]:  # fmt: skip
    """One token per row; see the module docstring for ``failures``."""
    out = []
    for row, rid, sampling, n in zip(rows, req_ids, samplings, num_tokens):
        try:
            out.append(sample(row, sampling.temperature, sampling.top_p, request_rng(sampling, n, default)))
        except Exception as e:
            if failures is None:
                raise
            failures.append((rid, f"sampling failed for this request ({type(e).__name__})"))
            out.append(int(np.argmax(row)))
    return out
