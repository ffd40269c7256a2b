"""Calibrate what a prompt step costs in a run beyond what its shape costs timed alone.

Timed in isolation (``calibrate.time_shapes``, even after the decode steps a run puts before
it), a step with a prompt chunk costs what the fitted model says; in a real run the very same
plan costs ~0.8 ms more (a 90-token prompt: 7.1 ms in the run, 6.3 ms when the run's recorded
plan is re-executed after decode steps, 6.2 ms as a calibration shape). It is not the plan,
page faults (a dozen a step), heap growth (none) or the engine's own work (14-21 us between
steps); decode steps show no such gap (within 4%). Rather than guess, this measures it: a
short real run of a workload of its own (``CALIBRATION_WORKLOAD``: neither the seeds' nor the
Azure trace's), every step priced by the fitted model (``step_replay``), and the median excess
of its prompt steps becomes ``Hardware.run_prompt_step``.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import replace
from typing import Any

from paged_bench.model.roofline import RooflineCost
from paged_bench.model.step_replay import replay

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


def run_prompt_step(cfg: dict[str, Any], cost: RooflineCost) -> tuple[RooflineCost, dict[str, float]]:
    """``cost`` with ``run_prompt_step`` set from a real run of ``calibration_run_config(cfg)``,
    and what the run showed: the median excess of its prompt steps and of its decode steps."""
    steps = replay(calibration_run_config(cfg), replace(cost, hardware=replace(cost.hardware, run_prompt_step=0.0)))
    prompt = [s.measured - s.predicted for s in steps.steps if not s.shape.startswith("decode")]
    decode = [s.measured - s.predicted for s in steps.steps if s.shape.startswith("decode")]
    excess = max(statistics.median(prompt), 0.0) if prompt else 0.0
    info = {"prompt_steps": len(prompt), "prompt_step_excess_s": excess,
            "decode_steps": len(decode), "decode_step_excess_s": statistics.median(decode) if decode else 0.0}  # fmt: skip
    return cost.with_fit(run_prompt_step=excess), info
