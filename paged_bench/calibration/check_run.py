"""Check a calibration against a real run of a workload of its own, step by step.

The fitted model is checked where it will be used: a short real run of
``CALIBRATION_WORKLOAD`` (neither the seeds' nor the Azure trace's), every step priced by the
model (``step_replay``); the preset records the median excess of the run's prompt steps and of
its decode steps over the model (``run`` in the preset). It is a check, not a correction:
under load from other processes (load average 1.3-2.3 on this 2-core VM) the prompt steps
of runs came out 0.9-1.1 ms over the model, a 90-token prompt 7.1 ms in a run against 6.3 ms
when the run's own plan was re-executed after decode steps, while on a quieter machine (load
~1.0) the real runs matched the model without any such term (the seeds' median TTFT within
2%); added as a term, it put the quiet runs 12% off. It is not heap growth (none), the
engine's own work (14-21 us between steps) or sampling (greedy); the KV pool's page faults
(30-65 a seed prompt step, until ``NumpyOps.new_pool`` made the pool resident) were not all
of it either: the check still finds 0-0.4 ms without them.
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

from paged_bench.calibration.step_replay import replay
from paged_bench.costmodel.roofline import RooflineCost

# short prompts arriving faster than one every step: prompts alone after idling, beside decodes
CALIBRATION_WORKLOAD = {
    "name": "poisson",
    "num_requests": 40,
    "rate": 15.0,
    "prompt_len": {"dist": "uniform", "low": 16, "high": 256},
    "output_len": {"dist": "lognormal", "mean": 24, "sigma": 0.8, "min": 2, "max": 96},
    "shared_prefix": {"num_prefixes": 0, "length": 0},
    "max_concurrency": None,
    "seed": 1,
}


def calibration_run_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` (the calibrated backend's) running ``CALIBRATION_WORKLOAD``, continuous batching, untracked."""
    run = copy.deepcopy(cfg)
    run["workload"] = copy.deepcopy(CALIBRATION_WORKLOAD)
    room = int(cfg["max_model_len"]) // 2  # a prompt and its output fit whatever the model's length
    run["workload"]["prompt_len"]["high"] = min(run["workload"]["prompt_len"]["high"], room)
    run["workload"]["prompt_len"]["low"] = min(run["workload"]["prompt_len"]["low"], room // 2)
    run["workload"]["output_len"]["max"] = min(run["workload"]["output_len"]["max"], room)
    run["tracking"]["enabled"] = False
    return run


def run_check(cfg: dict[str, Any], cost: RooflineCost) -> dict[str, float]:
    """A real run of ``calibration_run_config(cfg)`` priced by ``cost``: how many prompt and
    decode steps it ran, and the median of each kind's measured minus predicted seconds."""
    steps = replay(calibration_run_config(cfg), cost).steps
    prompt = [s.measured - s.predicted for s in steps if not s.shape.startswith("decode")]
    decode = [s.measured - s.predicted for s in steps if s.shape.startswith("decode")]
    return {"prompt_steps": len(prompt), "prompt_step_excess_s": statistics.median(prompt) if prompt else 0.0,
            "decode_steps": len(decode), "decode_step_excess_s": statistics.median(decode) if decode else 0.0}  # fmt: skip
