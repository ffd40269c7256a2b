"""Calibrate what a run pays the first time a step needs more heap than any step before it.

The numpy backend holds the memory its steps free for reuse (``model.heap``), so a step's
temporaries cost nothing to allocate once a step as large has run; but the heap grows, and
faults the growth in, whenever a step needs more than any before it: a run's first long
prompt, its chunks needing ever larger score matrices, paid 150-320 ms more than the next
prompt of its length (a 3,000-token prompt's ~1.2 s). This times the same long prompt
twice on a fresh heap (then trims it, and repeats): the difference, over the heap's growth,
is the seconds a byte of growth costs; the growth over the largest chunk's score matrices
(one layer's) is how much heap a step holds per score byte. ``RooflineCost.duration`` then
charges a simulated run's steps in order as the real heap grows.
"""

from __future__ import annotations

import statistics

import numpy as np

from paged_bench.backends.base import Backend
from paged_bench.core.clock import STEP_TIMERS
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import NewRequestData, StepPlan
from paged_bench.core.request import Request
from paged_bench.model import heap
from paged_bench.model.config import ModelConfig


def prompt_seconds(
    backend: Backend, allocator: PagedAllocator, req_id: int, token_ids: list[int], chunk: int
) -> list[float]:
    """Prefill ``token_ids`` as one request in chunks of ``chunk`` tokens: each step's seconds."""
    req = Request(req_id, 0.0, list(token_ids), 1)
    if not allocator.allocate_slots(req, len(token_ids)):
        raise ValueError(f"a {len(token_ids)}-token prompt does not fit the calibration pool")
    seconds, timer = [], STEP_TIMERS[backend.step_timer]  # as the engine times the backend's steps
    for start in range(0, len(token_ids), chunk):
        req.num_computed_tokens = start
        plan = StepPlan.starting([(NewRequestData.from_request(req, allocator.block_table(req)), chunk)])
        if start:
            plan = plan._replace(new_reqs=())  # the backend holds the request since its first chunk
        begin = timer()
        backend.execute(plan)
        seconds.append(timer() - begin)
    allocator.free(req)
    backend.execute(StepPlan(finished_req_ids=(req_id,)))
    return seconds


def time_heap_growth(
    backend: Backend, allocator: PagedAllocator, model: ModelConfig, num_tokens: int, chunk: int, repeats: int = 5
) -> tuple[float, float]:
    """(heap bytes per byte of one layer's scores: the median, seconds per byte of heap growth:
    the mean) of ``repeats`` rounds of one ``num_tokens`` prompt (a multiple of ``chunk``)
    prefilled twice on a freshly trimmed heap; (0, 0) where the heap cannot be measured (no
    glibc). The mean: growth in transparent huge pages was bimodal (the same 191 MB cost 272,
    35 and 246 ms in three rounds: compaction stalls); the bound numpy backend now grows in
    4 KiB pages (``model.heap``), which cost steadily, and the mean is what a run pays."""
    if heap.heap_size() is None:
        return 0.0, 0.0
    token_ids = np.random.default_rng(0).integers(0, model.vocab_size, num_tokens).tolist()
    # an eager attention's largest scores: the last chunk's queries x every key, all heads, fp32
    score_bytes = 4.0 * model.num_heads * chunk * num_tokens
    per_score, per_growth = [], []
    for round_no in range(repeats):
        heap.trim()
        before = heap.heap_size() or 0
        first = sum(prompt_seconds(backend, allocator, 2 * round_no, token_ids, chunk))
        growth = (heap.heap_size() or 0) - before
        again = sum(prompt_seconds(backend, allocator, 2 * round_no + 1, token_ids, chunk))
        if growth > 0:
            per_score.append(growth / score_bytes)
            per_growth.append(max(first - again, 0.0) / growth)
    if not per_score:
        return 0.0, 0.0
    return statistics.median(per_score), statistics.fmean(per_growth)
