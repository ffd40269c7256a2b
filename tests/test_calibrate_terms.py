"""The calibrated roofline's CPU terms: the per-token term on a step built to need it, the
calibration run's workload; the NNLS the fit solves with; a preset that prices a removed term;
the numpy backend holding its freed temporaries while bound, and its KV pool resident; the
script that decides which terms are kept (``benchmarks/term_evidence.py``)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

from paged_bench.calibration import shapes as cal_shapes
from paged_bench.calibration.check_run import CALIBRATION_WORKLOAD, calibration_run_config
from paged_bench.calibration.fit import _nnls
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.costmodel.roofline import (
    REMOVED_FIGURES,
    REMOVED_TERMS,
    Hardware,
    RooflineCost,
    load_preset,
    save_preset,
)
from paged_bench.costmodel.step_work import step_work
from paged_bench.errors import ConfigError
from paged_bench.model import heap
from paged_bench.model.config import PRESETS
from paged_bench.run import registry
from tests.conftest import compose_config

MODEL = PRESETS["small"]
BASE = Hardware("t", 100e9, 20e9, 10e9, kv_eff=0.2)


def _plan(shape: cal_shapes.Shape, continuing: bool = False):
    alloc = PagedAllocator(num_blocks=4096, block_size=16, prefix_caching=False)
    plan, _ = cal_shapes._plan(shape, alloc, np.random.default_rng(0), MODEL.vocab_size)
    return cal_shapes._continuing(plan) if continuing else plan


def _cost(**terms) -> RooflineCost:
    return RooflineCost(MODEL, replace(BASE, **terms), "float32")


def test_nnls_matches_an_exhaustive_search():
    rng = np.random.default_rng(0)
    for _ in range(100):
        a, b = rng.standard_normal((25, 5)), rng.standard_normal(25)
        best = min(
            (np.sum((a[:, cols] @ x - b) ** 2) for k in range(1, 6) for cols in itertools.combinations(range(5), k)
             for x in [np.linalg.lstsq(a[:, cols], b, rcond=None)[0]] if (x >= 0).all()),
            default=np.sum(b**2),
        )  # fmt: skip
        x = _nnls(a, b)
        assert (x >= 0).all() and np.sum((a @ x - b) ** 2) <= best + 1e-9


def test_a_preset_pricing_a_removed_term_is_refused_and_one_leaving_it_at_zero_loads(tmp_path):
    path = tmp_path / "old.json"
    save_preset(path, _cost(per_token=5e-6), {})
    data = json.loads(path.read_text())
    zeros = {**dict.fromkeys(REMOVED_TERMS, 0.0), **dict.fromkeys(REMOVED_FIGURES, 1e6)}  # figures: any value
    path.write_text(json.dumps({**data, "hardware": {**data["hardware"], **zeros}}))
    assert load_preset(path) == _cost(per_token=5e-6)
    for term in ("cold_step", "per_score_byte", "per_scattered_block"):
        path.write_text(json.dumps({**data, "hardware": {**data["hardware"], term: 5e-5}}))
        with pytest.raises(ConfigError, match=f"a preset without the removed terms {term} .calibrate again"):
            load_preset(path)


def test_each_new_token_costs_its_elementwise_work_beyond_the_matmuls():
    # a prompt chunk's norms, rotary and activations scale with its tokens: per_seq priced them
    # for a decode's one token alone, and the fit left low-context prefills ~9% short
    decodes = step_work(_plan(cal_shapes.Shape(4, 0, 0, 64), continuing=True), MODEL, "float32", 16)
    mixed = step_work(_plan(cal_shapes.Shape(4, 1, 64, 0), continuing=True), MODEL, "float32", 16)
    cost = _cost(per_token=5e-6)
    assert cost.seconds(decodes) - _cost().seconds(decodes) == pytest.approx(4 * 5e-6)
    assert cost.seconds(mixed) - _cost().seconds(mixed) == pytest.approx((4 + 64) * 5e-6)


def test_the_calibration_run_is_its_own_workload_and_fits_the_model():
    cfg = calibration_run_config(compose_config("backend=numpy", "max_model_len=160"))
    w = cfg["workload"]
    assert w["prompt_len"]["high"] + w["output_len"]["max"] <= 160 and not cfg["tracking"]["enabled"]
    assert w["seed"] == CALIBRATION_WORKLOAD["seed"] and w != compose_config("workload=seed")["workload"]


@pytest.mark.skipif(heap.heap_size() is None, reason="glibc only")
def test_the_numpy_backend_holds_freed_temporaries_while_bound_and_returns_them_after():
    holders = heap._holders  # backends other tests left bound hold the heap too
    huge_pages = heap.numpy_huge_pages()
    backend = registry.create("backend", "numpy", model="tiny", threads=1)
    backend.bind(PagedAllocator(num_blocks=8, block_size=16, prefix_caching=False, swap_blocks=0))
    # larger than anything free in the heap: by default glibc mmaps it and unmaps it when freed
    size = heap.free_bytes() + (64 << 20)
    mapped = heap.mmapped_bytes()
    block = np.ones(size // 4, np.float32)
    assert heap.mmapped_bytes() - mapped < size  # from the heap, which keeps it once freed
    assert not heap.numpy_huge_pages()  # in 4 KiB pages: no huge-page compaction stalls as it grows
    del block
    held = heap.heap_size()
    assert held >= size
    backend.close()
    assert heap._holders == holders
    if holders:
        return
    assert heap.numpy_huge_pages() == huge_pages  # numpy's own setting back
    size = heap.free_bytes() + (64 << 20)
    mapped = heap.mmapped_bytes()
    _held = np.ones(size // 4, np.float32)  # alive while mmapped_bytes is read
    assert heap.mmapped_bytes() - mapped >= size  # glibc's defaults are back: mmapped again
    assert heap.heap_size() < held  # and the held memory went back to the system


def test_the_numpy_kv_pool_is_resident_from_the_start():
    """A step writing a block for the first time must not page-fault it in (about one fault
    per two prompt tokens in a run, which no calibrated shape pays): the pool's pages are
    written when it is made, as torch.zeros leaves vLLM's KV cache."""
    resource = pytest.importorskip("resource")
    pool = registry.create("backend", "numpy", model="tiny", threads=1).ops.new_pool(1 << 16)  # 32 MiB
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    pool[...] = 1.0  # every slot written, as a run's steps do in time
    # np.zeros: ~530 here; the count is the process's, so another thread of the test worker may
    # add a fault or two (a run of the whole suite once saw 3)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults <= 20


def test_term_evidence_keeps_a_term_only_where_it_moves_a_replayed_case(tmp_path, monkeypatch, capsys):
    """``benchmarks/term_evidence.py`` (what decides which terms calibration keeps) on presets
    whose timed steps a known cost made: ``per_token`` priced at 60 us a token moves the seeds'
    prompt steps by more than 2% when it is refitted away, and is kept; at 0 it moves nothing."""
    import importlib.util
    from pathlib import Path

    from tests.test_calibrate import CURVE, _works

    root = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    spec = importlib.util.spec_from_file_location("term_evidence", root / "benchmarks" / "term_evidence.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    # one case, cut to 6 requests: a real numpy run, its steps priced by each refit
    monkeypatch.setattr(script, "WORKLOADS", {"seed": ()})
    monkeypatch.setattr(script, "SCHEDULERS", {"continuous": ()})
    monkeypatch.setattr(script, "overrides", lambda *case: ("workload=seed", "workload.num_requests=6"))
    works = _works(MODEL, cal_shapes.default_shapes(512))

    def per_token_row(per_token: float) -> list[str]:
        # with a measured matmul curve (as calibration measures it), nothing else prices a token's work
        truth = _cost(per_token=per_token, overhead=5e-4, per_seq=2e-5, matmul_curve=CURVE)
        # each step's work as a preset from before a removal keeps it: with a field StepWork no longer has
        samples = [{"work": {**vars(w), "score_bytes": 0.0}, "seconds": truth.seconds(w)} for w in works]
        preset = tmp_path / f"preset-{per_token}.json"
        save_preset(preset, _cost(matmul_curve=CURVE), {"samples": samples,
                                                        "engine": {"per_step_s": 0.0, "per_seq_s": 0.0}})  # fmt: skip
        monkeypatch.setattr("sys.argv", ["term_evidence.py", "--preset", str(preset)])
        script.main()
        out = capsys.readouterr().out
        assert f"{len(works)} timed steps of {preset}" in out
        row = next(line for line in out.splitlines() if line.startswith("| per_token |"))
        return [c.strip() for c in row.strip("|").split("|")]

    kept = per_token_row(6e-5)
    assert kept[2] == "seed/continuous" and float(kept[3].rstrip("%")) < -2 and kept[5] == "yes"
    unpriced = per_token_row(0.0)
    assert abs(float(unpriced[3].rstrip("%"))) < 1 and unpriced[5] == "no"
