"""The calibrated roofline's CPU terms, each on a step built to need it: K/V past the
last-level cache, the heap a run's first large steps grow (priced once, in run order), the
calibration run's workload; the NNLS the fit solves with; a preset that prices a removed term;
the numpy backend holding its freed temporaries while bound; its prompt scores, counted slice by slice."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from paged_bench.calibration import shapes as cal_shapes
from paged_bench.calibration.check_run import CALIBRATION_WORKLOAD, calibration_run_config
from paged_bench.calibration.fit import _nnls
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import NewRequestData, SamplingParams, StepPlan
from paged_bench.costmodel.roofline import Hardware, HeapMark, RooflineCost, load_preset, save_preset
from paged_bench.costmodel.step_work import RunTables, scattered_blocks, sliced_scores, step_work
from paged_bench.errors import ConfigError
from paged_bench.model import heap, ops_numpy
from paged_bench.model.config import PRESETS
from paged_bench.model.ops_torch import TorchOps
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
    path.write_text(json.dumps({**data, "hardware": {**data["hardware"], "cold_step": 0.0, "cache_bytes": 1e6}}))
    assert load_preset(path) == _cost(per_token=5e-6)
    path.write_text(json.dumps({**data, "hardware": {**data["hardware"], "cold_step": 5e-5}}))
    with pytest.raises(ConfigError, match="a preset without the removed terms cold_step .calibrate again"):
        load_preset(path)


def test_each_new_token_costs_its_elementwise_work_beyond_the_matmuls():
    # a prompt chunk's norms, rotary and activations scale with its tokens: per_seq priced them
    # for a decode's one token alone, and the fit left low-context prefills ~9% short
    decodes = step_work(_plan(cal_shapes.Shape(4, 0, 0, 64), continuing=True), MODEL, "float32", 16)
    mixed = step_work(_plan(cal_shapes.Shape(4, 1, 64, 0), continuing=True), MODEL, "float32", 16)
    cost = _cost(per_token=5e-6)
    assert cost.seconds(decodes) - _cost().seconds(decodes) == pytest.approx(4 * 5e-6)
    assert cost.seconds(mixed) - _cost().seconds(mixed) == pytest.approx((4 + 64) * 5e-6)


def test_kv_past_the_last_level_cache_beside_the_weights_is_priced_apart():
    work = step_work(_plan(cal_shapes.Shape(16, 0, 0, 3072), continuing=True), MODEL, "float32", 16)
    llc = 16 * 2**20
    cost = _cost(llc_bytes=float(llc), per_llc_spilled_byte=1e-10)
    room = llc - work.weight_bytes
    assert cost.llc_spilled_kv_bytes(work) == pytest.approx(work.kv_bytes + work.padding_kv_bytes - room)
    assert cost.llc_spilled_kv_bytes(work) > 0
    assert cost.seconds(work) - _cost().seconds(work) == pytest.approx(cost.llc_spilled_kv_bytes(work) * 1e-10)
    small = step_work(_plan(cal_shapes.Shape(1, 0, 0, 64), continuing=True), MODEL, "float32", 16)
    assert cost.llc_spilled_kv_bytes(small) == 0.0 and _cost().llc_spilled_kv_bytes(work) == 0.0


def test_heap_growth_is_priced_once_for_the_first_step_of_each_larger_size():
    cost = _cost(heap_bytes_per_score_byte=3.0, per_heap_growth_byte=1e-9)
    short, long = _plan(cal_shapes.Shape(0, 1, 256, 0)), _plan(cal_shapes.Shape(0, 1, 512, 512))
    need = [3.0 * step_work(p, MODEL, "float32", 16).score_bytes / MODEL.num_layers for p in (short, long)]
    plain = [cost.seconds(step_work(p, MODEL, "float32", 16)) for p in (short, long)]
    heap = HeapMark()
    assert cost.duration(short, 16, heap) == pytest.approx(plain[0] + need[0] * 1e-9)
    assert cost.duration(short, 16, heap) == pytest.approx(plain[0])  # the heap holds it now
    assert cost.duration(long, 16, heap) == pytest.approx(plain[1] + (need[1] - need[0]) * 1e-9)
    assert cost.duration(short, 16, heap) == pytest.approx(plain[0])
    assert cost.duration(short, 16, HeapMark()) == pytest.approx(plain[0] + need[0] * 1e-9)  # another run
    assert cost.duration(long, 16) == pytest.approx(plain[1])  # no run's heap: the step alone
    assert _cost().duration(long, 16, HeapMark()) == pytest.approx(plain[1])  # no calibrated growth


def test_blocks_read_out_of_pool_order_are_priced_per_block():
    # one row decoding its 34th token (3 blocks read) on a table of 4: only blocks it reads count
    plan = StepPlan((0,), (33,), (1,))
    assert scattered_blocks(plan, [(7, 8, 9, 2)], 16) == 0
    assert scattered_blocks(plan, [(7, 3, 4, 1)], 16) == 1  # 3 follows 7 out of order; 4 follows 3
    assert scattered_blocks(plan, [(9, 3, 1, 2)], 16) == 2
    work = step_work(plan, MODEL, "float32", 16, scattered=2)
    cost = _cost(per_scattered_block=3e-6)
    assert work.scattered_blocks == 2
    assert cost.seconds(work) - _cost().seconds(work) == pytest.approx(2 * 3e-6)


def test_a_run_prices_the_blocks_its_tables_scatter_as_they_grow():
    def new(req_id, blocks, computed):
        return NewRequestData(req_id, (), computed, blocks, computed, SamplingParams())

    cost = _cost(per_scattered_block=3e-6)
    steps = [
        StepPlan((0,), (31,), (1,), (new(0, (4, 5), 31),)),  # consecutive: no scattered block
        StepPlan((0,), (32,), (1,), new_block_ids={0: (9,)}),  # a third block far away: one
        StepPlan((0,), (33,), (1,)),  # still read
        StepPlan((1,), (16,), (1,), (new(1, (2, 3), 16),), finished_req_ids=(0,)),  # another request
    ]
    tables = RunTables()
    extra = [cost.duration(plan, 16, tables=tables) - cost.duration(plan, 16) for plan in steps]
    assert extra == pytest.approx([0.0, 3e-6, 3e-6, 0.0])
    # without the term, nothing is tracked: a preset calibrated before it prices runs as it did
    untracked = RunTables()
    _cost().duration(steps[0], 16, tables=untracked)
    assert untracked.states.by_id == {} and untracked.counted == {}


def test_counting_scattered_blocks_as_tables_grow_equals_counting_them_whole():
    from paged_bench.backends.request_state import RequestStates
    from paged_bench.run.bench import build

    # a pool-starved run: preemption frees and re-admits requests, and scatters their tables
    bench = build(compose_config("backend=sim", "workload=seed", "scheduler=preemptive", "num_blocks=32",
                                 "tracking.enabled=false"))  # fmt: skip
    plans, execute = [], bench.backend.execute
    bench.backend.execute = lambda plan: plans.append(plan) or execute(plan)
    assert bench.engine.run(bench.requests).num_preemptions > 0
    tables, states = RunTables(), RequestStates()
    counts = [tables.scattered_blocks(plan, 16) for plan in plans]
    assert counts == [scattered_blocks(plan, [row.block_ids for row in states.apply(plan)], 16) for plan in plans]
    assert max(counts) > 0

def test_calibration_times_shapes_on_blocks_scattered_over_the_pool():
    shapes = cal_shapes.default_shapes(4096)
    scattered = [s for s in shapes if s.scattered]
    assert {s.context for s in scattered} == {128, 1536} and any(s.prefills for s in scattered)
    allocator = cal_shapes._shuffled(600, np.random.default_rng(0))
    plan, _ = cal_shapes._plan(cal_shapes.Shape(4, 0, 0, 128, True), allocator, np.random.default_rng(0), 100)
    tables = [new.block_ids for new in plan.new_reqs]
    # 4 tables of 9 blocks (129 tokens): nearly every next block lies elsewhere in the pool
    assert scattered_blocks(plan, tables, 16) >= 30
    compact = _plan(cal_shapes.Shape(4, 0, 0, 128))
    assert scattered_blocks(compact, [new.block_ids for new in compact.new_reqs], 16) == 0

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


def test_sliced_scores_count_what_the_numpy_backends_prefill_attention_computes(monkeypatch):
    # the backend's own slicing, small enough here that the chunks after context slice
    monkeypatch.setattr(ops_numpy, "SCORE_ELEMENTS", 4096)
    backend = registry.create("backend", "numpy", model="tiny", threads=1)
    tiny = backend.model_config
    alloc = PagedAllocator(num_blocks=64, block_size=16, prefix_caching=False)
    backend.bind(alloc)
    computed = []
    attend = backend.ops._attend

    def counting(qg, kv, mask, scale):
        if mask.ndim == 2:  # a prompt slice: [rows, keys]
            computed.append(mask.size)
        return attend(qg, kv, mask, scale)

    monkeypatch.setattr(backend.ops, "_attend", counting)
    plan, _ = cal_shapes._plan(cal_shapes.Shape(2, 2, 40, 70), alloc, np.random.default_rng(0), tiny.vocab_size)
    backend.execute(plan)
    backend.close()
    assert backend.ops.score_slice == 4096 and len(computed) > 2  # sliced
    work = step_work(plan, tiny, "float32", 16, score_slice=4096)
    assert work.score_bytes == 4.0 * tiny.num_layers * tiny.num_heads * sum(computed) / tiny.num_layers
    # unsliced, the padded group's rectangle, as torch computes it
    assert step_work(plan, tiny, "float32", 16).score_bytes == 4.0 * tiny.num_layers * tiny.num_heads * 2 * 40 * 110


def test_sliced_scores_run_from_the_whole_rectangle_to_the_causal_triangle():
    assert sliced_scores(100, 50, 4, 1 << 30) == 50 * 150  # one slice: every key to the chunk's end, masked ones too
    assert sliced_scores(100, 50, 4, 4 * 150) == sum(100 + i for i in range(1, 51))  # a row a slice: the triangle
    assert 50 * 125 < sliced_scores(100, 50, 4, 4 * 150 * 10) < 50 * 150
    torch_ops = TorchOps(PRESETS["tiny"], torch.device("cpu"), torch.float32)  # each chunk whole, in one piece
    assert sliced_scores(100, 50, 4, torch_ops.score_slice) == 50 * 150
