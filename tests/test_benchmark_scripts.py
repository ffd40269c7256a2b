"""The benchmark scripts whose figures the docs quote still run, each cut to its smallest form:
a config check added to the engine once broke ``cluster_azure.py`` (its ``max_model_len`` was
past the model's positions) and nothing noticed until its figures were regenerated."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPTS = {
    "case_breakdown": (["--case", "a100-70b-tp4-pr2192-latency-bs64", "--case", "h100-8b-sharegpt-inf"],
                       "over 255 steps of 64 sequences: "),  # a ShareGPT case keeps its draw's prompts
    "client_cpu": (["--requests", "10", "--tokens", "4", "--gap-ms", "0", "--rounds", "1"], "paged_bench / vLLM's: "),
    "cluster_azure": (["--limit", "300", "--replicas", "2"], "cluster / engine replica-steps/s: "),
    "matmul_in_step": (["--rounds", "1", "--rows", "1", "2"], "| 2 | "),
    "measured_figures": ([], "| llama-3-8b | h100 TP1 | decode 1 x ctx 128 | 4.49 | "),
    "measured_loo": (["--gpu", "h100", "--tp", "1"], "h100: median |error| "),
    "measured_waves": (["--gpu", "h100", "--no-loo"], "every tile shape has at most as many waves at 256 rows as at 264: True"),
    "metrics_outputs": (["--repeats", "1", "workload.num_requests=300"], "same figures: True; same table content"),
    "numpy_memory": (["--rounds", "1", "--tokens", "1024"], "on blocks in a random order: 1 x 1536 tokens of 4096"),
    "prompt_steps": (["--case", "h100-8b-tp8-lambda-sharegpt320"],
                     "| h100-8b-tp8-lambda-sharegpt320 | h100 | llama-3-8b | 8 | 37 / 36 | 0.782 / 0.632 |"),
    "sharegpt_draws": (["--pin-lambda", "--seeds", "1", "--case", "h100-8b-sharegpt-inf"],
                       "the first 320 requests: mean prompt 204.9, completion at least 208.3 (172 "),
    "sim_speed": (["--cases", "seed", "--repeats", "1"], "| seed | compiled | "),
    "vllm_frontend_burst": (["--requests", "20", "--prompt-tokens", "40"], "burst of 20 requests: client CPU "),
    "vidur_inputs": (["--models", "Meta-Llama-3-8B,phi-2"], "| Meta-Llama-3-8B | 0% / 27% | 0% / 0% | 0% / 18% | 100% / 0% |"),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_script_runs(script):
    args, expected = SCRIPTS[script]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert expected in done.stdout, done.stdout[-2000:]


def _sim_vs_numpy():
    spec = importlib.util.spec_from_file_location("sim_vs_numpy", ROOT / "benchmarks" / "sim_vs_numpy.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_sim_vs_numpy_keeps_each_numpy_run_as_it_ends(tmp_path, monkeypatch):
    script = _sim_vs_numpy()
    real_run, done = script.run, []

    def run(overrides):  # real numpy runs of the seeds' workload, cut to 8 requests; the third one fails
        if len(done) == 2:
            raise RuntimeError("the machine went away")
        done.append(real_run((*overrides, "workload.num_requests=8")))
        return done[-1]

    monkeypatch.setattr(script, "run", run)
    preset, log = tmp_path / "preset.json", tmp_path / "runs.jsonl"
    preset.write_text('{"shapes": []}')  # what the probes are compared with: nothing
    monkeypatch.setattr(sys, "argv", ["sim_vs_numpy.py", "--preset", str(preset), "--log", str(log), "--repeats", "2",
                                      "--workloads", "seed", "--schedulers", "static,continuous"])  # fmt: skip
    with pytest.raises(RuntimeError, match="went away"):
        script.main()
    kept = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["round"], r["workload"], r["scheduler"]) for r in kept] == [(1, "seed", "static"), (1, "seed", "continuous")]
    for record, summary in zip(kept, done, strict=True):
        assert record["median_ttft_ms"] == summary["median_ttft_ms"] > 0
        assert record["output_throughput"] == summary["output_throughput"] > 0
    assert len(kept[0]["probe_ms"]) == len(script.PROBES)


def test_sim_vs_numpy_runs_its_numpy_rounds_amid_the_calibrations():
    script = _sim_vs_numpy()
    # three rounds among nine: after the 2nd, 5th and 8th, calibration rounds on both sides of each
    assert script.numpy_rounds_after(9, 3) == {1: 1, 4: 1, 7: 1}
    assert script.numpy_rounds_after(9, 1) == {4: 1}
    for numpy_rounds in range(1, 30):
        after = script.numpy_rounds_after(9, numpy_rounds)
        assert sum(after.values()) == numpy_rounds and set(after) <= set(range(9))
        assert max(after.values()) - min(after.values()) <= 1  # evenly: none crowded where others are bare
        assert numpy_rounds < 9 or set(after) == set(range(9))


def test_sim_vs_numpy_finds_the_cost_nearest_to_none_that_meets_each_cell(tmp_path, monkeypatch):
    from paged_bench.costmodel.roofline import HARDWARE, RooflineCost, save_preset
    from paged_bench.model.config import PRESETS

    script = _sim_vs_numpy()
    monkeypatch.setattr(script, "COST_SCAN", 8)  # +-8%: enough to meet a TTFT 15% long, and quicker
    monkeypatch.setattr(script, "sim_at_cost", functools.cache(script.sim_at_cost))  # each cost simulated once
    preset = tmp_path / "preset.json"
    save_preset(preset, RooflineCost(PRESETS["small"], HARDWARE["cpu"], "float32"), {})
    case = (*script.overrides("seed", "continuous"), "workload.num_requests=8")
    real = dict(script.sim_at_cost(preset, case, 1.0))  # "numpy" figures the simulator meets as calibrated ...
    real["median_ttft_ms"] *= 1.15  # ... but for a TTFT that a dearer cost must stretch
    real["p99_ttft_ms"] *= 3  # and one no cost within the scan reaches
    found = script.meeting_costs(preset, case, real)
    assert found["output_throughput"] == found["median_itl_ms"] == 0.0
    assert found["median_ttft_ms"] > 0 and found["p99_ttft_ms"] is None
    scan = {d: script.sim_at_cost(preset, case, 1 + d / 100) for d in range(-script.COST_SCAN, script.COST_SCAN + 1)}
    for key, cost in found.items():
        meets = {d for d, sim in scan.items() if abs(sim[key] / real[key] - 1) <= script.GOAL}
        if cost is None:
            assert not meets, key
        else:  # the change found meets the cell, and no smaller one does
            assert round(cost * 100) in meets and min(meets, key=lambda d: (abs(d), d)) == round(cost * 100), key


def test_numpy_score_slices_times_each_slice_size_and_puts_the_shipped_one_back(monkeypatch, capsys):
    import paged_bench.model.ops_numpy as ops_numpy
    from paged_bench.calibration.shapes import Shape

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("numpy_score_slices", ROOT / "benchmarks" / "numpy_score_slices.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shipped, seen = ops_numpy.SCORE_ELEMENTS, []
    prefill = ops_numpy.NumpyOps._prefill

    def prefill_seen(*args, **kwargs):  # the slice size each timed prompt step ran with
        seen.append(ops_numpy.SCORE_ELEMENTS)
        return prefill(*args, **kwargs)

    monkeypatch.setattr(ops_numpy.NumpyOps, "_prefill", prefill_seen)
    monkeypatch.setattr(script, "SHAPES", [Shape(0, 1, 64, 0)])
    monkeypatch.setattr(script, "SLICES", (1 << 22, 1 << 12))
    monkeypatch.setattr(sys, "argv", ["numpy_score_slices.py", "--rounds", "1"])
    script.main()
    out = capsys.readouterr().out
    assert "| chunk after context | 4 Mi floats (16 MiB) | 0.00390625 Mi floats (0.015625 MiB) |" in out
    row = next(line for line in out.splitlines() if line.startswith("| 64 after 0 |"))
    assert all(float(cell) > 0 for cell in row.strip("|").split("|")[1:])
    assert set(seen) == {1 << 22, 1 << 12} and ops_numpy.SCORE_ELEMENTS == shipped


STUB_USES = """
import abc, sys
import torch
import torch.nn.functional as F
from torch import nn

class Layer(nn.Module, abc.ABC):  # vLLM's classes mix nn.Module with ABC
    @abc.abstractmethod
    def forward(self): ...

@torch.inference_mode()
def three():
    return 3

assert three() == 3
assert torch.float16 is torch.float16 and {torch.float16: 1}[torch.float16] == 1
assert torch.float16 is not torch.bfloat16
assert not torch.cuda.is_available() and torch.version.cuda is None and torch.version.hip is None
assert not torch.Tensor
assert torch.iinfo(torch.long).max == 2**63 - 1 and torch.iinfo(torch.long).min == -(2**63)
assert F.silu is F.silu and issubclass(Layer, nn.Module)
with torch.no_grad():
    pass
print("stub", torch.__version__, "torch" in sys.modules)
"""


def test_vllm060_torch_stub_stands_for_what_vllms_api_server_imports():
    """benchmarks/vllm060/torch_stub (the API server process on CPython 3.10, where no torch wheel is
    here): subclassing with ABC, decorators that hand back the function, dtypes that are one object
    each, false availability, and iinfo's real bounds (vLLM bounds the request's seed with them)."""
    done = subprocess.run([sys.executable, "-c", STUB_USES], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT / "benchmarks" / "vllm060" / "torch_stub")}, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "stub 2.4.0 True"


def _frontend_burst(monkeypatch):
    spec = importlib.util.spec_from_file_location("vllm_frontend_burst", ROOT / "benchmarks" / "vllm_frontend_burst.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # its dataclasses look their module up
    spec.loader.exec_module(script)
    return script


def test_frontend_burst_sends_each_request_its_max_tokens_on_its_schedule(monkeypatch):
    """vllm060_engine_burst.py's ShareGPT cases: each request of a burst asks for its own output
    length (vLLM's benchmark client sends max_tokens = the completion's length), streamed back; its
    QPS cases: each request sent after its gap."""
    import asyncio

    from aiohttp import web

    script, asked = _frontend_burst(monkeypatch), {}

    async def completions(request):
        body = await request.json()
        asked[int(body["user"])] = body["max_tokens"]
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(body["max_tokens"]):
            await response.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        return response

    async def run():
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/completions"
        try:
            streams = await script.burst(url, ["a", "b", "c"], "m", [3, 1, 2])
            assert asked == {0: 3, 1: 1, 2: 2}
            with pytest.raises(ValueError, match="1 max_tokens and 2 gaps for 2 prompts"):  # one length a request
                await script.burst(url, ["a", "b"], "m", [3])
            alike = await script.burst(url, ["d", "e"], "m", 4)
            assert asked == {0: 4, 1: 4, 2: 2}
            begin = time.perf_counter()
            return streams, alike, begin, await script.burst(url, ["f", "g", "h"], "m", 1, gaps=[0.0, 0.05, 0.1])
        finally:
            await runner.cleanup()

    streams, alike, begin, spaced = asyncio.run(run())
    assert asked == {0: 1, 1: 1, 2: 1}
    assert all(s.sent <= s.first <= s.last for s in streams + alike + spaced)
    # benchmark_serving.py's schedule: each request sent after its gaps so far, never before (the
    # gap between two sends may be shorter: a task stamps its send when the event loop first runs it)
    assert spaced[1].sent - begin >= 0.05 and spaced[2].sent - begin >= 0.15


def test_matmul_in_step_multiplies_only_the_lm_head_once_the_layers_are_handed_back():
    """What ``benchmarks/matmul_in_step.py`` subtracts: the same step with no layer product
    computed again (the LM head still multiplies), and ``linear`` restored afterwards."""
    import numpy as np

    from paged_bench.calibration.shapes import Shape, time_shape
    from paged_bench.core.kv.paged import PagedAllocator
    from paged_bench.run import registry

    spec = importlib.util.spec_from_file_location("matmul_in_step", ROOT / "benchmarks" / "matmul_in_step.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    backend = registry.create("backend", "numpy", model="tiny", threads=1)
    allocator = PagedAllocator(num_blocks=16, block_size=16, prefix_caching=False, swap_blocks=0)
    backend.bind(allocator)
    multiplied, linear = [], backend.ops.linear

    def counting(x, weight):
        multiplied.append(weight)
        return linear(x, weight)

    backend.ops.linear = counting
    rng = np.random.default_rng(0)
    try:
        with script.layers_replayed(backend):
            time_shape(backend, Shape(2, 0, 0, 16), allocator, rng)  # the first pass computes them
            first = len(multiplied)
            multiplied.clear()
            time_shape(backend, Shape(2, 0, 0, 16), allocator, rng)
    finally:
        backend.close()
    assert first > len(multiplied) > 0
    assert all(weight is backend.weights.lm_head for weight in multiplied)
    assert backend.ops.linear is counting


def test_itl_spread_prints_both_runs_gaps_around_their_medians(tmp_path, monkeypatch, capsys):
    from paged_bench.costmodel.roofline import HARDWARE, RooflineCost, save_preset
    from paged_bench.model.config import PRESETS

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("itl_spread", ROOT / "benchmarks" / "itl_spread.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    preset = tmp_path / "preset.json"
    save_preset(preset, RooflineCost(PRESETS["small"], HARDWARE["cpu"], "float32"), {})
    cut = script.overrides  # the seeds' continuous case, cut to 6 requests
    monkeypatch.setattr(script, "overrides", lambda *case: (*cut(*case), "workload.num_requests=6"))
    monkeypatch.setattr(sys, "argv", ["itl_spread.py", "--preset", str(preset), "--workloads", "seed",
                                      "--schedulers", "continuous"])  # fmt: skip
    script.main()
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {"seed/continuous, numpy", "seed/continuous, sim"}
    cells = {k: [c.strip() for c in row.strip("|").split("|")[1:]] for k, row in rows.items()}
    for gaps, *percentiles, near in cells.values():
        values = [float(v) for v in percentiles]
        assert values == sorted(values) and values[0] > 0 and 0 < float(near.rstrip("%")) <= 100
    # the same requests and outputs: as many gaps in both runs, but two backends' timings
    assert cells["seed/continuous, numpy"][0] == cells["seed/continuous, sim"][0] != "0"
    assert cells["seed/continuous, numpy"][1:-1] != cells["seed/continuous, sim"][1:-1]
    # pooled as the summary's ITL: the deterministic simulator's p50 is its run's median ITL
    from sim_vs_numpy import run

    sim = run(("backend=sim", f"backend.preset={preset}", *script.overrides("seed", "continuous")))
    assert float(cells["seed/continuous, sim"][4]) == pytest.approx(sim["median_itl_ms"], abs=0.006)
    # a row read off made-up gaps: half at 1 ms, half at 3 (the median, 2 ms, has none near it)
    gaps = script.np.array([1.0, 1.0, 3.0, 3.0])
    assert script.spread_row("x", gaps) == "| x | 4 | 1.00 | 1.40 | 1.70 | 2.00 | 2.30 | 2.60 | 3.00 | 0% |"
    # median 2.025: 2.0 and 2.05 lie within 5% of it, 1.9 (6% under) does not
    assert script.spread_row("x", script.np.array([1.9, 2.0, 2.05, 9.0])).endswith("| 50% |")


def test_prompt_steps_groups_first_tokens_a_step_a_group(monkeypatch):
    import numpy as np

    spec = importlib.util.spec_from_file_location("prompt_steps", ROOT / "benchmarks" / "prompt_steps.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "prompt_steps", script)  # its dataclass looks its module up
    spec.loader.exec_module(script)
    # steps 50 ms apart; the second step's outputs reach the client in two parts 8 ms apart; a
    # request with no text (0); a late prompt after a decode window (2.0 s)
    ttfts = np.array([1.0, 1.001, 1.05, 1.058, 1.10, 1.15, 0.0, 2.0])
    prompts = np.array([10, 20, 30, 40, 50, 60, 70, 80])
    steps = script.prompt_steps(ttfts, prompts)
    assert steps.starts.tolist() == [1.0, 1.05, 1.10, 1.15]
    assert steps.tokens_in_span == 30 + 40 + 50 + 60  # after the first group, inside the last
    assert steps.per_step == pytest.approx(0.05)
    with pytest.raises(script.ConfigError, match="three or more"):
        script.prompt_steps(np.array([1.0, 1.0, 0.0]), np.array([1, 2, 3]))
