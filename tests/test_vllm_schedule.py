"""``workload.schedule=vllm``: the send times of ``vllm bench serve``.

The reference is vLLM's ``get_request`` in ``vllm/benchmarks/serve.py`` (commit ``009e6d4a``;
the schedule came with PR #21108): with ``np.random.seed(args.seed)`` done in ``main_async``,
it draws one gap per request, ``np.random.gamma(shape=burstiness, scale=1 / (rate *
burstiness))`` (its docstring and ``--burstiness`` help: gamma gaps, a Poisson process at
burstiness 1, burstier below 1, more even above; ``inf``: every gap 1 / rate), sums them from
the first (the first request is sent one gap after the start), and rescales the sums so the
last is at ``total_requests / request_rate``. ``_vllm_delay_ts`` below transcribes that loop.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from paged_bench.errors import ConfigError
from paged_bench.model.tokenizers import ByteTokenizer
from paged_bench.run.bench import build
from paged_bench.run.compose import compose_config
from paged_bench.workloads.base import WorkloadContext
from paged_bench.workloads.bursty import BurstyWorkload
from paged_bench.workloads.poisson import PoissonWorkload
from paged_bench.workloads.uniform import UniformWorkload

CTX = WorkloadContext(vocab_size=1000, encode=ByteTokenizer().encode)


def _vllm_delay_ts(total_requests: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """vLLM's ``get_request`` up to its sleeps, loop for loop (ramp-up off, not self-timed)."""
    np.random.seed(seed)  # main_async; the random dataset samples from a generator of its own
    delay_ts: list[float] = []
    for _ in range(total_requests):
        if request_rate == float("inf"):
            delay_ts.append(0)
        elif burstiness == float("inf"):
            delay_ts.append(1.0 / request_rate)
        else:
            theta = 1.0 / (request_rate * burstiness)
            delay_ts.append(np.random.gamma(shape=burstiness, scale=theta))
    for i in range(1, len(delay_ts)):
        delay_ts[i] += delay_ts[i - 1]
    if delay_ts[-1] != 0:
        target_total_delay_s = total_requests / request_rate
        normalize_factor = target_total_delay_s / delay_ts[-1]
        delay_ts = [delay * normalize_factor for delay in delay_ts]
    return delay_ts


def _arrivals(cls, schedule: str = "vllm", ctx: WorkloadContext = CTX, **kw) -> np.ndarray:
    base = {"num_requests": 200, "rate": 8.0, "prompt_len": 8, "output_len": 4, "seed": 3, "schedule": schedule}
    return np.array([r.arrival_time for r in cls(**{**base, **kw}).requests(ctx)])


@pytest.mark.parametrize(("cls", "kw", "burstiness"), [
    (PoissonWorkload, {}, 1.0),
    (BurstyWorkload, {"burstiness": 0.5}, 0.5),
    (BurstyWorkload, {"burstiness": 3.0, "seed": 0, "num_requests": 1, "rate": 2.0}, 3.0),
    (UniformWorkload, {"rate": 7.0}, math.inf),
    (PoissonWorkload, {"rate": math.inf}, 1.0),
])  # fmt: skip
def test_the_very_send_times_of_vllms_client(cls, kw, burstiness):
    """Same N, rate, burstiness and seed: the same times as vLLM's, bit for bit."""
    ours = _arrivals(cls, **kw)
    n, rate, seed = kw.get("num_requests", 200), kw.get("rate", 8.0), kw.get("seed", 3)
    assert ours.tolist() == _vllm_delay_ts(n, rate, burstiness, seed)


def test_the_first_request_leaves_one_gap_in_and_the_last_leaves_at_n_over_rate():
    n, rate, shape = 500, 8.0, 0.5
    ours = _arrivals(BurstyWorkload, num_requests=n, rate=rate, burstiness=shape)
    drawn = np.random.RandomState(3).gamma(shape, 1 / (rate * shape), n)  # the gaps, before the rescale
    assert ours[-1] == pytest.approx(n / rate, rel=1e-12)
    assert ours[0] > 0 and ours[0] == pytest.approx(drawn[0] * (n / rate) / drawn.sum(), rel=1e-12)
    assert np.all(np.diff(ours) >= 0)
    # ours starts at 0 and is not rescaled: the check above tells the two apart
    zero = _arrivals(BurstyWorkload, schedule="first_at_zero", num_requests=n, rate=rate, burstiness=shape)
    assert zero[0] == 0 and abs(zero[-1] - n / rate) > 1e-3


# the gamma CDF in closed form for the shapes tested (no scipy): P(shape, x / scale)
GAMMA_CDF = {
    0.5: lambda x: np.vectorize(math.erf)(np.sqrt(x)),
    1.0: lambda x: 1 - np.exp(-x),
    2.0: lambda x: 1 - np.exp(-x) * (1 + x),
}


def _ks(sample: np.ndarray, cdf) -> float:
    x = np.sort(sample)
    f, n = cdf(x), len(x)
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


@pytest.mark.parametrize("shape", sorted(GAMMA_CDF))
def test_the_gaps_are_gamma_with_shape_burstiness_and_mean_one_over_rate(shape):
    """Kolmogorov-Smirnov against gamma(shape, scale 1 / (rate x shape)) at the 0.1% level
    (critical D = 1.95 / sqrt(N)), and the coefficient of variation 1 / sqrt(shape); a wrong
    shape is refused by the same test (so it cannot pass by accident)."""
    n, rate = 20_000, 8.0
    gaps = np.diff(np.concatenate(([0.0], _arrivals(BurstyWorkload, num_requests=n, rate=rate, burstiness=shape))))
    assert gaps.mean() == pytest.approx(1 / rate, rel=1e-12)  # the rescale: N gaps, N / rate
    critical = 1.95 / math.sqrt(n)
    scaled = gaps * rate * shape  # gamma(shape, scale 1)
    assert _ks(scaled, GAMMA_CDF[shape]) < critical
    for other in set(GAMMA_CDF) - {shape}:
        assert _ks(gaps * rate * other, GAMMA_CDF[other]) > 3 * critical
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(shape), rel=0.05)


def test_auto_is_vllms_with_target_openai_and_ours_in_process_and_served():
    """target=openai measures a server as vLLM's client would; target=served compares our server
    with the same config in-process (experiment serve_overhead), so it keeps the engine's arrivals."""
    assert _arrivals(PoissonWorkload, "auto", WorkloadContext(1000, CTX.encode, "openai")).tolist() == \
        _vllm_delay_ts(200, 8.0, 1.0, 3)  # fmt: skip
    assert _arrivals(PoissonWorkload, "auto")[0] == 0
    knobs = ("workload=poisson", "workload.num_requests=20", "seed=5", "backend=sim")
    remote = build(compose_config(*knobs, "target=openai"))
    assert [r.arrival_time for r in remote.requests] == _vllm_delay_ts(20, 25.0, 1.0, 5)
    in_process = [r.arrival_time for r in build(compose_config(*knobs)).requests]
    assert in_process[0] == 0
    assert [r.arrival_time for r in build(compose_config(*knobs, "target=served")).requests] == in_process
    assert [r.arrival_time for r in build(compose_config(*knobs, "workload.schedule=vllm")).requests] == \
        _vllm_delay_ts(20, 25.0, 1.0, 5)  # fmt: skip


def test_bad_schedules_and_seeds_are_named():
    with pytest.raises(ConfigError, match="workload.schedule='vLLM'.*auto, first_at_zero, vllm"):
        _arrivals(PoissonWorkload, "vLLM")
    with pytest.raises(ConfigError, match=r"workload.seed=4294967296 .*at most 4294967295 with workload.schedule=vllm"):
        _arrivals(PoissonWorkload, seed=2**32)
    assert _arrivals(PoissonWorkload, "first_at_zero", seed=2**32)[0] == 0  # our own stream takes any seed
