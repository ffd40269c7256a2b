"""The simulator's roofline and its calibration: the fit recovers known coefficients, presets
round-trip, the calibrate command runs a real backend end to end, and the default linear cost
model is untouched."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from paged_bench.backends.sim import LinearCost, SimBackend
from paged_bench.calibration import calibrate as cal
from paged_bench.calibration import matmuls as cal_matmuls
from paged_bench.calibration import shapes as cal_shapes
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import NewRequestData, StepPlan
from paged_bench.core.request import Request
from paged_bench.costmodel.roofline import HARDWARE, Hardware, RooflineCost, load_preset, save_preset
from paged_bench.costmodel.step_work import step_work
from paged_bench.errors import ConfigError
from paged_bench.model.config import PRESETS
from paged_bench.run.backend_options import SimOptions
from paged_bench.run.bench import build
from tests.conftest import compose_config


def _works(model, shapes, dtype="float32"):
    alloc = PagedAllocator(num_blocks=4096, block_size=16, prefix_caching=False)
    rng = np.random.default_rng(0)
    works = []
    for shape in shapes:
        plan, reqs = cal_shapes._plan(shape, alloc, rng, model.vocab_size)
        works.append(step_work(plan, model, dtype, cal_shapes.BLOCK_SIZE))
        for r in reqs:
            alloc.free(r)
    return works


def test_fit_recovers_the_coefficients_that_made_the_times():
    model = PRESETS["small"]
    truth = RooflineCost(model, Hardware("t", 100e9, 20e9, 10e9, 1.2e-3, 4e-5, 0.55, 0.8, 0.25, 0.12), "float32")
    works = _works(model, cal_shapes.default_shapes())
    rng = np.random.default_rng(1)
    samples = [(w, truth.seconds(w) * rng.uniform(0.98, 1.02)) for w in works]  # 2% noise
    start = RooflineCost(model, Hardware("t", 100e9, 20e9, 10e9), "float32")  # efficiencies 1, no overhead
    fitted = cal.fit(start, samples)
    assert cal.fit_errors(fitted, samples)["median_abs_rel_err"] < 0.02
    # with 2% noise the fit may trade a little of the attention FLOPs for the K/V gather
    for name, rel in (("overhead", 0.1), ("compute_eff", 0.1), ("attn_eff", 0.15), ("kv_eff", 0.1)):
        assert getattr(fitted.hardware, name) == pytest.approx(getattr(truth.hardware, name), rel=rel), name


def test_roofline_decode_is_memory_bound_and_prefill_compute_bound():
    model, hw = PRESETS["llama-3-8b"], HARDWARE["h100"]
    cost = RooflineCost(model, hw, "bfloat16")
    shapes = [cal_shapes.Shape(1, 0, 0, 512), cal_shapes.Shape(64, 0, 0, 512), cal_shapes.Shape(0, 1, 2048, 0)]
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
        SimOptions(cost_model="roofline", hardware="tpu")
    with pytest.raises(ConfigError, match="backend.cost_model"):
        SimOptions(cost_model="quadratic")


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
    shapes = cal_shapes.default_shapes(160)
    # every shape, each kept with its work so the preset can be refitted (benchmarks/term_evidence.py)
    assert data["fit"]["samples"] == len(shapes) == len(data["samples"]) == len(data["shapes"])
    assert data["run"]["prompt_steps"] > 0 and data["run"]["decode_steps"] > 0  # checked on a real run
    assert data["hardware"]["overhead"] > 0
    assert f"backend.preset={out}" in capsys.readouterr().out
    sim = build(compose_config("backend=sim", f"backend.preset={out}", "workload.num_requests=4"))
    assert sim.engine.run(sim.requests).error is None
    assert cal.main(["backend=sim", "--hardware", "cpu", "--out", str(tmp_path / "x.json")]) == 2
    assert cal.main(["backend=nope"]) == 2  # a composition error: one line, no traceback



def test_calibration_runs_the_callers_work_amid_its_timing_rounds(monkeypatch):
    # sim_vs_numpy runs its real runs there, to meet the machine at the speed the calibration saw
    log = []

    def logged(name, rounds):
        def wrapper(*args):
            for figures in rounds(*args):
                log.append(name)
                yield figures

        return wrapper

    monkeypatch.setattr(cal, "shape_rounds", logged("shapes", cal.shape_rounds))
    monkeypatch.setattr(cal, "matmul_rounds", logged("matmuls", cal.matmul_rounds))
    cfg = compose_config("backend=numpy", "backend.model=tiny", "max_model_len=160")
    shapes = cal_shapes.default_shapes(160)
    cost, info = cal.calibrate(cfg, HARDWARE["cpu"], shapes, 2, log.append)
    # two rounds of shapes, three of matmuls (the fewest the curve takes), the caller's work after each
    assert log == ["shapes", "matmuls", 0, "shapes", "matmuls", 1, "matmuls", 2]
    longest = max(s.decodes + s.prefills * s.chunk for s in shapes)
    assert [p[0] for p in cost.hardware.matmul_curve] == cal_matmuls.curve_points(longest)
    assert len(info["shapes"]) == len(shapes)

# a BLAS-like curve: one row runs a matrix-vector kernel, 2-3 rows a slow matrix-matrix edge
CURVE = ((1.0, 1e-4, 1e-6), (2.0, 3e-4, 2e-6), (3.0, 4e-4, 3e-6), (4.0, 2e-4, 2e-6), (8.0, 3e-4, 4e-6))


def test_a_measured_matmul_curve_prices_the_matmuls_instead_of_the_roofline():
    model = PRESETS["small"]
    hw = Hardware("t", 100e9, 20e9, 10e9, overhead=1e-3, matmul_curve=CURVE)
    cost = RooflineCost(model, hw, "float32")
    two, four = _works(model, [cal_shapes.Shape(2, 0, 0, 16), cal_shapes.Shape(4, 0, 0, 16)])
    # 2 rows cost more than 4, as the curve says; a FLOP roofline would say the opposite
    assert cost.matmul_seconds(two) == pytest.approx(3e-4 + 2e-6)
    assert cost.matmul_seconds(four) == pytest.approx(2e-4 + 2e-6)
    assert cost.seconds(two) > cost.seconds(four)
    # between points: interpolated; past the last: along the last segment
    (six,) = _works(model, [cal_shapes.Shape(6, 0, 0, 16)])
    assert cost.matmul_seconds(six) == pytest.approx(2.5e-4 + 3e-6)
    (prefill,) = _works(model, [cal_shapes.Shape(0, 1, 12, 0)])
    assert cost.matmul_seconds(prefill) == pytest.approx(3e-4 + (12 - 8) * (3e-4 - 2e-4) / 4 + 1e-6)
    # tensor parallel has no measured curve: the roofline prices a rank's matmuls
    assert RooflineCost(model, hw, "float32", tp=2).matmul_seconds(two) != cost.matmul_seconds(two)


def test_fit_with_a_curve_recovers_the_per_step_and_per_token_costs():
    model = PRESETS["small"]
    truth = RooflineCost(model, Hardware("t", 100e9, 20e9, 10e9, 4e-4, 3e-5, 1.0, 1.0, 0.25, 0.12, per_token=6e-6,
                                         matmul_curve=CURVE), "float32")  # fmt: skip
    works = _works(model, cal_shapes.default_shapes())
    rng = np.random.default_rng(1)
    samples = [(w, truth.seconds(w) * rng.uniform(0.99, 1.01)) for w in works]
    fitted = cal.fit(RooflineCost(model, Hardware("t", 100e9, 20e9, 10e9, matmul_curve=CURVE), "float32"), samples)
    assert cal.fit_errors(fitted, samples)["median_abs_rel_err"] < 0.02
    for name in ("overhead", "per_token"):
        assert getattr(fitted.hardware, name) == pytest.approx(getattr(truth.hardware, name), rel=0.15), name


def test_preset_with_a_curve_round_trips(tmp_path):
    cost = RooflineCost(PRESETS["small"], Hardware("t", 1e11, 2e10, 1e10, per_token=1e-5, matmul_curve=CURVE),
                        "float32")  # fmt: skip
    save_preset(tmp_path / "p.json", cost, {})
    assert load_preset(tmp_path / "p.json") == cost


def test_time_matmuls_measures_the_backends_own_matmuls():
    from paged_bench.run import registry

    backend = registry.create("backend", "numpy", model="tiny", threads=1)
    backend.bind(PagedAllocator(num_blocks=8, block_size=16, prefix_caching=False, swap_blocks=0))
    curve = cal_matmuls.time_matmuls(backend, PRESETS["tiny"], 40, repeats=1)
    backend.close()
    assert [p[0] for p in curve] == [*range(1, 17), 24, 36, 40] == cal_matmuls.curve_points(40)
    assert all(layers > 0 and head > 0 for _, layers, head in curve)


def test_calibration_times_decode_rows_as_running_requests():
    alloc = PagedAllocator(num_blocks=64, block_size=16, prefix_caching=False)
    plan, _ = cal_shapes._plan(cal_shapes.Shape(3, 1, 32, 16), alloc, np.random.default_rng(0), 256)
    timed = cal_shapes._continuing(plan)
    # only the prompt chunk's request is new; the decodes are held by the backend already
    assert [new.req_id for new in timed.new_reqs] == [3] and timed.req_ids == plan.req_ids
    assert cal_shapes.lead_in(cal_shapes.Shape(3, 1, 32, 16)) == cal_shapes.Shape(3, 0, 0, 16)
    assert cal_shapes.lead_in(cal_shapes.Shape(0, 2, 32, 0)) == cal_shapes.Shape(1, 0, 0, 16)


def test_step_replay_prices_every_step_the_real_run_ran():
    from paged_bench.calibration.step_replay import replay, shape_of, shape_table

    cost = RooflineCost(PRESETS["tiny"], HARDWARE["cpu"], "float32")
    cfg = compose_config("backend=numpy", "backend.model=tiny", "workload.num_requests=6", "tracking.enabled=false")
    result = replay(cfg, cost)
    assert result.steps and result.run_seconds >= sum(s.measured for s in result.steps) > 0
    assert all(s.predicted > 0 for s in result.steps)
    table = shape_table(result.steps)
    assert sum(r["steps"] for r in table) == len(result.steps)
    assert sum(r["busy_share"] for r in table) == pytest.approx(1.0)
    alloc = PagedAllocator(num_blocks=64, block_size=16, prefix_caching=False)
    rng = np.random.default_rng(0)
    assert shape_of(cal_shapes._plan(cal_shapes.Shape(4, 0, 0, 16), alloc, rng, 256)[0]) == "decode 4"
    assert shape_of(cal_shapes._plan(cal_shapes.Shape(0, 2, 100, 0), alloc, rng, 256)[0]) == "prefill 2x<=128 after 0"
    after = cal_shapes._plan(cal_shapes.Shape(0, 1, 64, 300), alloc, rng, 256)[0]  # 64 tokens after 300 cached
    assert shape_of(after) == "prefill 1x<=64 after <=512"


def test_an_eager_attention_pays_for_padding():
    model = PRESETS["small"]
    kv_token = model.kv_bytes_per_token()
    alloc = PagedAllocator(num_blocks=256, block_size=16, prefix_caching=False)
    rows = []
    # two decodes: the group pads the first to 400 keys; two prompt chunks of different lengths
    # beside them run each alone (AttnGroup.each), unpadded
    for i, (ctx, n) in enumerate(((15, 1), (399, 1), (0, 32), (100, 200))):
        req = Request(i, 0.0, list(range(ctx + n)), 1)
        assert alloc.allocate_slots(req, ctx + n)
        req.num_computed_tokens = ctx
        rows.append((NewRequestData.from_request(req, alloc.block_table(req)), n))
    padding = (2 * 400 - (16 + 400)) * kv_token
    assert step_work(StepPlan.starting(rows), model, "float32", 16).padding_kv_bytes == padding
    work = step_work(StepPlan.starting(rows[:2]), model, "float32", 16)  # the decodes alone: K/V-bound
    assert work.padding_kv_bytes == padding
    base = Hardware("t", 100e9, 20e9, 10e9, kv_eff=0.2)
    fused, eager = (RooflineCost(model, replace(base, eager_attention=e), "float32") for e in (False, True))
    assert eager.seconds(work) - fused.seconds(work) == pytest.approx(work.padding_kv_bytes / (20e9 * 0.2))


def test_a_checkpoints_calibration_is_named_after_its_folder_not_the_small_preset():
    """With backend.model_path set, backend.model still says small: numpy-small.json, the preset
    the docs run with, was overwritten by a checkpoint's calibration."""
    from paged_bench.calibration.calibrate import _model_name

    assert _model_name({"model": "small", "model_path": "/data/ckpts/my-llama"}) == "my-llama"
    assert _model_name({"model": "small"}) == "small" and _model_name({"model": {"preset": "tiny"}}) == "custom"
