"""Where a synthetic workload's gaps put its requests on the clock: ours, or ``vllm bench serve``'s.

``first_at_zero`` (ours, and vLLM's client before July 2025): the first request at 0, each next
one a drawn gap later; N requests span N - 1 gaps, so the last lands near (N - 1) / rate.

``vllm``: vLLM's ``get_request`` (``vllm/benchmarks/serve.py`` since PR #21108, "Sending request
strictly follows the random intervals"; read at commit ``009e6d4a``) draws N gaps, one per
request, the first included, so the first request leaves one gap after the start; it sums them
and rescales the sums so that the last request is sent at exactly N / rate (its comment: the
gamma draws' sum strays 1-2% from N / rate, which moved the measured throughput from seed to
seed). Its gaps come from numpy's global legacy stream, seeded by ``np.random.seed(--seed)``,
one ``np.random.gamma(shape=burstiness, scale=1 / (rate * burstiness))`` per request; a
``np.random.RandomState(seed)`` draws the very same numbers (one call of ``size=N`` gives the
N scalar calls' values, bit for bit), so the same N, rate, burstiness and seed give the same
send times as ``vllm bench serve --seed SEED`` with the random dataset, whose sampling uses a
generator of its own and leaves the global stream untouched. ``--request-rate inf`` sends all
at 0 and ``--burstiness inf`` spaces them evenly, 1 / rate apart (our ``uniform`` workload).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from paged_bench.errors import check

SCHEDULES = ("auto", "first_at_zero", "vllm")
MAX_LEGACY_SEED = 2**32 - 1  # np.random.seed's (and so vLLM's --seed's) largest


def first_at_zero(gaps: np.ndarray) -> np.ndarray:
    """Arrival times from ``n - 1`` gaps: the first request at 0, then each gap in turn."""
    return np.concatenate(([0.0], np.cumsum(gaps)))


def vllm_arrivals(n: int, rate: float, burstiness: float | None, seed: int,
                  draw_gaps: Callable[[int], np.ndarray]) -> np.ndarray:  # fmt: skip
    """``n`` send times as vLLM's ``get_request`` computes them (its ``delay_ts``): gamma gaps of
    shape ``burstiness`` drawn as vLLM draws them, or, for an arrival process that is no gamma
    (``burstiness`` None: a plugin's), ``draw_gaps(n)``, the workload's own; summed, and
    rescaled so that the last is at ``n / rate``."""
    if math.isinf(rate):
        return np.zeros(n)  # vLLM: a delay of 0 each, and nothing to rescale
    if burstiness is None:
        delays = draw_gaps(n)
    elif math.isinf(burstiness):
        delays = np.full(n, 1.0 / rate)
    else:
        check(seed <= MAX_LEGACY_SEED, "workload.seed", seed,
              f"at most {MAX_LEGACY_SEED} with workload.schedule=vllm (numpy's legacy seeding, as vLLM's "
              "np.random.seed takes)")  # fmt: skip
        delays = np.random.RandomState(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    arrivals = np.cumsum(delays)  # sequential sums, as vLLM's loop adds them
    if arrivals[-1] != 0:
        arrivals = arrivals * ((n / rate) / arrivals[-1])  # vLLM's normalize_factor, applied to each
    return arrivals
