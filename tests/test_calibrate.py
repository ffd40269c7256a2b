"""The simulator's roofline and its calibration: the fit recovers known coefficients, presets
round-trip, the calibrate command runs a real backend end to end, and the default linear cost
model is untouched."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paged_bench.allocators.paged import PagedAllocator
from paged_bench.backends.sim import LinearCost, SimBackend
from paged_bench.build import build
from paged_bench.errors import ConfigError
from paged_bench.model import calibrate as cal
from paged_bench.model.config import PRESETS
from paged_bench.model.roofline import HARDWARE, Hardware, RooflineCost, load_preset, save_preset, step_work
from paged_bench.request import Request
from paged_bench.step import NewRequestData, StepPlan
from tests.conftest import compose_config


def _works(model, shapes, dtype="float32"):
    alloc = PagedAllocator(num_blocks=4096, block_size=16, prefix_caching=False)
    rng = np.random.default_rng(0)
    works = []
    for shape in shapes:
        plan, reqs = cal._plan(shape, alloc, rng, model.vocab_size)
        works.append(step_work(plan, model, dtype, 16))
        for r in reqs:
            alloc.free(r)
    return works


def test_fit_recovers_the_coefficients_that_made_the_times():
    model = PRESETS["small"]
    truth = RooflineCost(model, Hardware("t", 100e9, 20e9, 10e9, 1.2e-3, 4e-5, 0.55, 0.8, 0.25, 0.12), "float32")
    works = _works(model, cal.default_shapes())
    rng = np.random.default_rng(1)
    samples = [(w, truth.seconds(w) * rng.uniform(0.98, 1.02)) for w in works]  # 2% noise
    start = RooflineCost(model, Hardware("t", 100e9, 20e9, 10e9), "float32")  # efficiencies 1, no overhead
    fitted = cal.fit(start, samples)
    assert cal.fit_errors(fitted, samples)["median_abs_rel_err"] < 0.02
    # attention FLOPs and an eager attention's score traffic both grow with prompt length
    # squared: with 2% noise the fit may trade a little of one for the other
    for name, rel in (("overhead", 0.1), ("compute_eff", 0.1), ("attn_eff", 0.15), ("kv_eff", 0.1)):
        assert getattr(fitted.hardware, name) == pytest.approx(getattr(truth.hardware, name), rel=rel), name


def test_roofline_decode_is_memory_bound_and_prefill_compute_bound():
    model, hw = PRESETS["llama-3-8b"], HARDWARE["h100"]
    cost = RooflineCost(model, hw, "bfloat16")
    shapes = [cal.Shape(1, 0, 0, 512), cal.Shape(64, 0, 0, 512), cal.Shape(0, 1, 2048, 0)]
    decode1, decode64, prefill = _works(model, shapes, "bfloat16")
    weights_s = model.matmul_params * 2 / (hw.mem_bandwidth * hw.memory_eff)
    assert cost.seconds(decode1) == pytest.approx(hw.overhead + hw.per_seq + weights_s, rel=0.05)
    # a wider batch reads the same weights: per token, far cheaper
    assert cost.seconds(decode64) / 64 < cost.seconds(decode1) / 10
    flops_s = prefill.matmul_flops / (hw.peak_flops * hw.compute_eff)
    assert flops_s > weights_s and cost.seconds(prefill) >= flops_s


def test_preset_round_trips_and_drives_the_simulator(tmp_path):
    cost = RooflineCost(PRESETS["small"], HARDWARE["cpu"], "float32")
    path = tmp_path / "p.json"
    save_preset(path, cost, {"backend": "numpy", "fit": {"samples": 0}})
    assert load_preset(path) == cost
    sim = build(compose_config("backend=sim", f"backend.preset={path}", "workload.num_requests=8"))
    assert sim.backend.roofline == cost and sim.backend.kv_bytes_per_token == PRESETS["small"].kv_bytes_per_token()
    result = sim.engine.run(sim.requests)
    assert result.error is None and result.steps
    assert next(result.steps.rows()).duration == pytest.approx(cost.duration(_first_plan(sim.requests[0]), 16))


def _first_plan(req):
    fresh = Request(req.request_id, 0.0, list(req.prompt_token_ids), req.max_tokens)
    return StepPlan.starting([(NewRequestData.from_request(fresh, ()), fresh.num_tokens)])


def test_bad_presets_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="backend.preset"):
        SimBackend(preset=str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(ConfigError, match="backend.preset"):
        SimBackend(preset=str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match="backend.hardware"):
        SimBackend(cost_model="roofline", hardware="tpu")
    with pytest.raises(ConfigError, match="backend.cost_model"):
        SimBackend(cost_model="quadratic")


def test_default_sim_keeps_its_linear_cost_model():
    sim = build(compose_config("backend=sim"))
    assert sim.backend.roofline is None and sim.backend.kv_bytes_per_token is None
    assert sim.backend.cost == LinearCost(3e-3, 0.4e-3, 0.5e-3, 1e-6, 0.05e-3)


def test_calibrate_command_end_to_end(tmp_path, capsys):
    out = tmp_path / "tiny.json"
    code = cal.main(["backend=numpy", "backend.model=tiny", "max_model_len=160", "--hardware", "cpu",
                     "--repeats", "1", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["backend"] == "numpy" and data["model"]["num_layers"] == PRESETS["tiny"].num_layers
    assert data["fit"]["samples"] == len(cal.default_shapes(160))
    assert data["hardware"]["overhead"] > 0
    assert f"backend.preset={out}" in capsys.readouterr().out
    sim = build(compose_config("backend=sim", f"backend.preset={out}", "workload.num_requests=4"))
    assert sim.engine.run(sim.requests).error is None
    assert cal.main(["backend=sim", "--hardware", "cpu", "--out", str(tmp_path / "x.json")]) == 2
    assert cal.main(["backend=nope"]) == 2  # a composition error: one line, no traceback
