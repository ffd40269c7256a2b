"""A published run's requests, as a trace file ``workload=trace`` replays.

The ShareGPT lengths the vLLM posts ran are not shipped here (the dataset is not ours to
ship): they are modelled. Prompt and output lengths are each drawn lognormal (``SIGMA`` of
their log) and filtered as vLLM's benchmark sampler filters ShareGPT (vllm-project/vllm,
``benchmarks/benchmark_serving.py``, ``sample_sharegpt_requests``, tag v0.6.0: a prompt or an
output under 4 tokens is dropped, and so is a prompt over 1,024 tokens or a prompt + output
over 2,048); the lognormals' means are then set so that the kept lengths' means are the
published ones (202 in, 179 out for the 0.6.0 post's 500 prompts). Arrivals are vLLM's
``benchmark_serving.py``'s: every request at once for ``rate=inf``, else exponential gaps of
mean 1/rate (a Poisson process), the first request at 0.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from paged_bench.validate.cases import Workload

SIGMA = 1.0  # of log(length), prompts and outputs: ShareGPT's lengths span two orders of magnitude
MIN_TOKENS = 4  # vLLM's sampler drops a prompt or an output shorter than this
MAX_PROMPT = 1024  # ... a prompt longer than this
MAX_TOTAL = 2048  # ... and a prompt + output longer than this
_FITS = 12  # rounds of rescaling the lognormals' means to the published means of what is kept


def _filtered(rng: np.random.Generator, n: int, prompt_mean: float, output_mean: float) -> np.ndarray:
    """``n`` (prompt, output) pairs drawn and filtered as vLLM's sampler keeps them."""
    kept: list[np.ndarray] = []
    count = 0
    while count < n:
        draws = 4 * n
        prompts = np.rint(rng.lognormal(math.log(prompt_mean) - SIGMA**2 / 2, SIGMA, draws))
        outputs = np.rint(rng.lognormal(math.log(output_mean) - SIGMA**2 / 2, SIGMA, draws))
        ok = ((prompts >= MIN_TOKENS) & (outputs >= MIN_TOKENS) & (prompts <= MAX_PROMPT)
              & (prompts + outputs <= MAX_TOTAL))  # fmt: skip
        pairs = np.stack([prompts[ok], outputs[ok]], axis=1).astype(np.int64)
        kept.append(pairs)
        count += len(pairs)
    return np.concatenate(kept)[:n]


def sharegpt_lengths(n: int, prompt_mean: int, output_mean: int, seed: int) -> np.ndarray:
    """``n`` (prompt, output) pairs like vLLM's ShareGPT sample: lognormal, filtered as its
    sampler filters, their means after the filter matched to ``prompt_mean`` / ``output_mean``
    (the draw is the same ``seed`` each round; only the means move)."""
    want = np.array([prompt_mean, output_mean], dtype=float)
    means = want.copy()
    for _ in range(_FITS):
        got = _filtered(np.random.default_rng(seed), n, *means).mean(axis=0)
        means *= want / got
    return _filtered(np.random.default_rng(seed), n, *means)


def arrival_times(n: int, rate: float, seed: int) -> np.ndarray:
    """vLLM's benchmark_serving.py's arrivals: all at 0 for an infinite rate, else a Poisson
    process of ``rate`` per second starting at 0."""
    if math.isinf(rate):
        return np.zeros(n)
    gaps = np.random.default_rng(seed + 1).exponential(1.0 / rate, n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def write_trace(workload: Workload, path: Path, seed: int = 0) -> Path:
    """``workload``'s requests as a CSV of arrival_time, prompt_len, output_len (``path``)."""
    n = workload.num_requests
    if workload.dataset == "sharegpt":
        lengths = sharegpt_lengths(n, workload.prompt_len, workload.output_len, seed)
    else:
        lengths = np.tile([workload.prompt_len, workload.output_len], (n, 1))
    arrivals = arrival_times(n, workload.rate, seed)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["arrival_time", "prompt_len", "output_len"])
        out.writerows((f"{t:.6f}", int(p), int(o)) for t, (p, o) in zip(arrivals, lengths, strict=True))
    return path
