"""A published run's requests, as a trace file ``workload=trace`` replays.

ShareGPT runs draw from the ShareGPT lengths shipped with paged_bench
(``paged_bench.workloads.sharegpt``: 992 of ShareGPT_V3_unfiltered_cleaned_split's
conversations in Llama 3 tokens, the rows vLLM v0.6.0's length filter keeps), N independent
draws whose mean prompt and output lengths come within 2.5% of the source's published means
(``sharegpt_with_means``: the source gives its totals, not which conversations its seed took),
each output exactly its completion's length (vLLM's nightly benchmark sends ``--ignore-eos``). Fixed-length sets (vLLM's sonnet sets) send the case's lengths every time.
A listed workload sends each request with the lengths its source measured for it; an output of 0
(the model ended at its first token) is one generated token.
Arrivals are vLLM's ``benchmark_serving.py``'s: every request at once for ``rate=inf``, else
the very gaps its client draws (a Poisson process: ``np.random.seed(seed)``, then
``np.random.exponential(1 / rate)`` after each request is sent, v0.4-0.6's ``get_request``), the
first request at 0.
"""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path

import numpy as np

from paged_bench.validate.cases import Workload
from paged_bench.workloads.schedule import first_at_zero
from paged_bench.workloads.sharegpt import sharegpt_with_means


@functools.lru_cache(maxsize=256)
def request_lengths(workload: Workload, seed: int) -> np.ndarray:
    """``workload``'s (prompt_len, output_len) per request (a ShareGPT workload's ``prompt_len``
    and ``output_len`` are the published means its draw matches). Kept, read-only: the simulation
    and the document's workload column ask for the same draws."""
    if workload.dataset == "listed":  # a request that ended at its first token still computed that token
        lengths = np.column_stack([workload.prompt_lens, np.maximum(workload.output_lens, 1)])
    elif workload.dataset == "sharegpt":
        lengths = sharegpt_with_means(workload.num_requests, (workload.prompt_len, workload.output_len), seed)
    else:
        lengths = np.tile([workload.prompt_len, workload.output_len], (workload.num_requests, 1))
    lengths.flags.writeable = False
    return lengths


def arrival_times(n: int, rate: float, seed: int) -> np.ndarray:
    """vLLM's benchmark_serving.py's send times with ``--seed seed`` (its default, 0, for the
    published runs): all at 0 for an infinite rate, else the gaps its client draws, from numpy's
    global (legacy) generator seeded so and drawn by nothing else before them for the ShareGPT
    and sonnet datasets (v0.6.0: benchmarks/benchmark_serving.py main() and get_request)."""
    if math.isinf(rate):
        return np.zeros(n)
    return first_at_zero(np.random.RandomState(seed).exponential(1.0 / rate, n - 1))


def write_trace(workload: Workload, path: Path, seed: int = 0) -> Path:
    """``workload``'s requests as a CSV of arrival_time, prompt_len, output_len (``path``)."""
    lengths = request_lengths(workload, seed)
    arrivals = arrival_times(workload.num_requests, workload.rate, seed)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["arrival_time", "prompt_len", "output_len"])
        out.writerows((f"{t:.6f}", int(p), int(o)) for t, (p, o) in zip(arrivals, lengths, strict=True))
    return path
