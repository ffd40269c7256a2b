"""The engine's own per-step CPU work, measured and added to a calibrated roofline."""

from __future__ import annotations

import json

import pytest

from paged_bench.calibration import calibrate as cal
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
