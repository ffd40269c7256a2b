"""The engine's own per-step CPU work, measured and added to a calibrated roofline."""

from __future__ import annotations

import json

import pytest

from paged_bench.calibration import calibrate as cal
from paged_bench.calibration import shapes as cal_shapes
from paged_bench.calibration.engine_cost import EngineCost, measure_engine_cost


def test_engine_cost_is_measured_per_step_and_per_sequence():
    cost = measure_engine_cost(batch_sizes=(1, 16), output_len=16, repeats=1)
    # (on a loaded machine the slope alone can come out 0: the line as a whole is the figure)
    assert cost.per_step >= 0 and cost.per_seq >= 0
    assert 0 < cost.per_step + 16 * cost.per_seq < 5e-3  # microseconds, not a forward pass


def test_calibration_adds_the_engine_cost_to_what_the_backend_costs(tmp_path, monkeypatch):
    fitted = {}
    real_fit = cal.fit

    def spy_fit(cost, samples, **kw):
        fitted["cost"] = real_fit(cost, samples, **kw)
        return fitted["cost"]

    monkeypatch.setattr(cal, "fit", spy_fit)
    timers = []  # the engine's cost is timed as the backend's steps are (backend.step_timer)
    monkeypatch.setattr(cal, "measure_engine_cost",
                        lambda repeats, step_timer: timers.append(step_timer) or EngineCost(per_step=2e-3, per_seq=1e-4))  # fmt: skip
    out = tmp_path / "tiny.json"
    assert cal.main(["backend=numpy", "backend.model=tiny", "max_model_len=160", "--hardware", "cpu",
                     "--repeats", "1", "--out", str(out)]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert data["hardware"]["overhead"] == pytest.approx(fitted["cost"].hardware.overhead + 2e-3)
    assert data["hardware"]["per_seq"] == pytest.approx(fitted["cost"].hardware.per_seq + 1e-4)
    assert data["engine"] == {"per_step_s": 2e-3, "per_seq_s": 1e-4} and timers == ["wall"]


def test_fit_finds_what_an_eager_attention_pays_for_its_scores():
    from paged_bench.costmodel.roofline import Hardware, RooflineCost
    from paged_bench.model.config import PRESETS
    from tests.test_calibrate import _works

    model = PRESETS["small"]
    hw = Hardware("t", 100e9, 20e9, 10e9, 1.2e-3, 4e-5, 0.55, 0.8, 0.25, 0.12, per_score_byte=1e-9)
    truth = RooflineCost(model, hw, "float32")
    samples = [(w, truth.seconds(w)) for w in _works(model, cal_shapes.default_shapes(4096))]
    long_prefill = max(samples, key=lambda s: s[0].score_bytes)
    assert long_prefill[0].score_bytes * 1e-9 > 0.3 * long_prefill[1]  # the scores weigh on long prompts
    fitted = cal.fit(RooflineCost(model, Hardware("t", 100e9, 20e9, 10e9), "float32"), samples)
    assert fitted.hardware.per_score_byte == pytest.approx(1e-9, rel=0.1)
    assert cal.fit_errors(fitted, samples)["max_abs_rel_err"] < 0.05
