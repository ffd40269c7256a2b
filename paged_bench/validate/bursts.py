"""What a cell with every request sent at once says on its own, whatever the GPU's speed.

vLLM 0.x without chunked prefill runs prompt steps first (a step that admits prompts runs no
decodes: ``_schedule_default``, vllm/core/scheduler.py, v0.6.0). Give it ``n`` equal prompts at
once, first come first served, and let them reach the engine ``L`` seconds after they were sent:
their prefills end evenly spread over the prefill phase ``P``, so the mean TTFT is about
``L + P / 2`` (plus half a prefill step), and the run lasts at least ``L + P``. So from the
published mean TTFT and the run's duration ``D`` (``n`` / the request throughput) alone:

- ``L >= 2 x TTFT - D``: the least delay before the engine's first prefill (or of every first
  token) that the figures need; positive means no engine speed, fast or slow, gives both figures
  from requests that reach the engine when they are sent;
- ``P <= 2 x (D - TTFT)``, so the engine prefilled at least ``n x prompt tokens / (2 (D - TTFT))``
  tokens a second.

The same two numbers from the simulated figures show what the simulator did (its ``L`` is its
front end's: 0 without one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from paged_bench.validate.cases import Case
from paged_bench.validate.simulate import Compared


@dataclass(frozen=True)
class Burst:
    """The two bounds, in seconds and prompt tokens a second."""

    start_floor_s: float  # the least delay before the first prefill (<= 0: no bound)
    prefill_floor: float  # the least prefill rate (prompt tokens / s)


def burst_bounds(num_requests: int, prompt_len: int, throughput: float, mean_ttft_ms: float) -> Burst:
    """The bounds from a run's request throughput (req/s) and mean TTFT (ms)."""
    duration = num_requests / throughput
    ttft = mean_ttft_ms / 1e3
    return Burst(2 * ttft - duration, num_requests * prompt_len / (2 * (duration - ttft)))


def is_burst(case: Case) -> bool:
    """A fixed-length case with every request at once and both figures published."""
    metrics = {f.metric for f in case.figures}
    w = case.workload
    return math.isinf(w.rate) and w.dataset == "fixed" and {"request_throughput", "mean_ttft_ms"} <= metrics


def burst_table(rows: Sequence[Compared]) -> list[str]:
    """A markdown table of the bounds, published and simulated, for every burst case whose
    published figures bound the delay (a long decode after the prefills leaves none)."""
    by_case: dict[str, dict[str, Compared]] = {}
    for r in rows:
        if is_burst(r.case):
            by_case.setdefault(r.case.name, {})[r.figure.metric] = r
    head = "| case | published: least start delay | least prefill rate | simulated: start delay bound | prefill rate bound |"
    out = [head, "|---|---:|---:|---:|---:|"]
    for name, figs in by_case.items():
        thr, ttft = figs["request_throughput"], figs["mean_ttft_ms"]
        w = thr.case.workload
        pub = burst_bounds(w.num_requests, w.prompt_len, thr.figure.published, ttft.figure.published)
        if pub.start_floor_s <= 0:
            continue
        cells = [_delay(pub.start_floor_s), f"{pub.prefill_floor:,.0f} tok/s"]
        if thr.simulated is None or ttft.simulated is None:
            cells += ["-", "-"]
        else:
            sim = burst_bounds(w.num_requests, w.prompt_len, thr.simulated, ttft.simulated)
            cells += [_delay(sim.start_floor_s), f"{sim.prefill_floor:,.0f} tok/s"]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out if len(out) > 2 else []


def _delay(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds > 0 else "none (<= 0)"
