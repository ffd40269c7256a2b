"""Calibration's step shapes, and how each is timed: as a run meets it.

A ``Shape`` is one step a real backend runs (decodes at a context, prompt chunks after cached
tokens, or both); ``shape_rounds`` times every shape once a round, each after the steps a run
puts before it, and ``typical_seconds`` of its rounds is what the fit takes it to cost.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from paged_bench.backends.base import Backend
from paged_bench.core.clock import STEP_TIMERS
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import NewRequestData, StepPlan
from paged_bench.core.request import Request
from paged_bench.costmodel.step_work import StepWork, step_work
from paged_bench.errors import ConfigError
from paged_bench.model.config import ModelConfig

BLOCK_SIZE = 16
WARM_STEPS = 3  # untimed steps a timed one follows (decodes of the batch, or of the lead-in)
TIMED_STEPS = 3  # a decode batch's steps timed in a row, per round (their median)


@dataclass(frozen=True)
class Shape:
    """One timed step: ``decodes`` sequences decoding at context ``context``, plus ``prefills``
    chunks of ``chunk`` new tokens (after ``context`` cached ones)."""

    decodes: int
    prefills: int
    chunk: int
    context: int


def default_shapes(max_len: int = 512) -> list[Shape]:
    """Decode batches, prefill chunks, and the mixed steps continuous batching runs most: a
    prompt chunk beside a batch of decodes. Chunks go up to ``max_len`` (long prompts are
    prefilled in one chunk of up to ``max_num_batched_tokens``)."""
    ctxs = [c for c in (16, 128, 384) if c < max_len]
    chunks = [n for n in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if n < max_len]
    shapes = [Shape(b, 0, 0, c) for b, c in itertools.product((1, 2, 4, 8, 16, 32), ctxs)]
    shapes += [Shape(0, p, n, 0) for p, n in itertools.product((1, 2, 4), chunks) if p * n <= 1024]
    shapes += [Shape(0, 1, n, c) for n, c in ((64, 128), (128, 256), (512, 512)) if n + c < max_len]
    mixed = itertools.product((1, 4, 8, 16), (32, 96, 512, 2048), (16, 128))
    shapes += [Shape(b, 1, n, c) for b, n, c in mixed if n + c < max_len and (n <= 96 or b in (1, 8))]
    # long contexts (what long prompts leave): decodes, and chunks of a prompt after earlier
    # chunks, alone, two at once, and beside decodes
    longs = [c for c in (1024, 3072) if c + 512 < max_len]
    decode_longs = [c for c in (1024, 2048, 3072) if c + 512 < max_len]
    shapes += [Shape(b, 0, 0, c) for b, c in itertools.product((1, 2, 4, 16), decode_longs)]
    # one sequence decoding at every context a long prompt leaves, densely: a long-prompt
    # workload runs little else (99% of the Azure window's steps), and with three points one
    # noisy one tilted the fitted K/V rate (the Azure median ITL 10-14% slow)
    shapes += [Shape(1, 0, 0, c) for c in (512, 768, 1280, 1536, 1792, 2560) if c + 512 < max_len]
    shapes += [Shape(b, p, 512, c) for b, p, c in itertools.product((0, 8), (1, 2), longs) if b or p == 1]
    return shapes


def _plan(
    shape: Shape, allocator: PagedAllocator, rng: np.random.Generator, vocab: int, first_id: int = 0
) -> tuple[StepPlan, list[Request]]:
    reqs, rows = [], []
    specs = [(shape.context, 1)] * shape.decodes + [(shape.context, shape.chunk)] * shape.prefills
    for i, (ctx, n) in enumerate(specs):
        req = Request(first_id + i, 0.0, rng.integers(0, vocab, ctx + n).tolist(), 1)
        if not allocator.allocate_slots(req, ctx + n):
            raise ConfigError("calibration shape", shape, "fewer tokens than the calibration pool holds")
        req.num_computed_tokens = ctx
        reqs.append(req)
        rows.append((NewRequestData.from_request(req, allocator.block_table(req)), n))
    return StepPlan.starting(rows), reqs


def _continuing(plan: StepPlan) -> StepPlan:
    """``plan`` once its decoding requests are running: a run's decode rows are requests the
    backend already holds (only a prompt's first chunk brings a new one), and setting up a
    new request's state costs what a decode step of it never pays."""
    return plan._replace(new_reqs=tuple(new for new, n in zip(plan.new_reqs, plan.num_new_tokens) if n > 1))


def time_shapes(
    backend: Backend, model: ModelConfig, dtype: str, shapes: Sequence[Shape], repeats: int = 3
) -> list[tuple[StepWork, float]]:
    """``shape_rounds``' samples after ``repeats`` rounds."""
    *_, samples = itertools.islice(shape_rounds(backend, model, dtype, shapes), repeats)
    return samples


def shape_rounds(
    backend: Backend, model: ModelConfig, dtype: str, shapes: Sequence[Shape]
) -> Iterator[list[tuple[StepWork, float]]]:
    """After each round over every shape, the samples so far: (work, seconds:
    ``typical_seconds`` of the rounds) of ``backend.execute`` for each shape.

    The repeats are rounds over every shape rather than back-to-back runs of one, so that a
    burst of load from elsewhere on a shared machine spreads over the shapes instead of
    skewing the few it lands on (a skewed shape bends the whole fit).

    Each shape is timed as a run meets it, since that changes its cost by as much as its
    shape does: its decoding requests already running (``_continuing``), after the steps a run
    puts before it: a decode batch after ``WARM_STEPS`` of the same batch (a run decodes step
    after step: one warm step left a one-sequence decode 10% slower than in a run), then the
    median of ``TIMED_STEPS`` in a row; a step with a prompt chunk after ``WARM_STEPS`` decode
    steps (``lead_in``: prompts arrive amid decodes), not after itself (which finds its
    activations and K/V still in cache)."""
    need = (
        2
        * max(s.decodes + s.prefills for s in shapes)
        * -(-max(s.context + max(s.chunk, 1) for s in shapes) // BLOCK_SIZE)
    )
    allocator = PagedAllocator(num_blocks=need + 1, block_size=BLOCK_SIZE, prefix_caching=False, swap_blocks=0)
    backend.bind(allocator)
    rng = np.random.default_rng(0)
    times: list[list[float]] = [[] for _ in shapes]
    works: list[StepWork] = []
    for round_no in itertools.count():
        for i, shape in enumerate(shapes):
            plan, seconds = time_shape(backend, shape, allocator, rng)
            times[i].append(seconds)
            if round_no == 0:
                works.append(step_work(plan, model, dtype, BLOCK_SIZE))
        yield [(work, typical_seconds(t)) for work, t in zip(works, times)]


def time_shape(
    backend: Backend, shape: Shape, allocator: PagedAllocator, rng: np.random.Generator
) -> tuple[StepPlan, float]:
    """``shape`` timed once as a run meets it (``shape_rounds`` says how) on ``allocator``'s
    blocks: its first plan (every row new) and the seconds of the timed step. Its requests are
    let go after."""
    vocab = backend.vocab_size
    plan, reqs = _plan(shape, allocator, rng, vocab)
    backend.execute(plan)  # first touch of this shape's K/V and buffers; its requests start
    timed = _continuing(plan)
    if shape.prefills:
        lead_plan, lead_reqs = _plan(lead_in(shape), allocator, rng, vocab, len(reqs))
        backend.execute(lead_plan)
        for _ in range(WARM_STEPS - 1):
            backend.execute(_continuing(lead_plan))
        reqs += lead_reqs
        seconds = _seconds(backend, timed)
    else:
        for _ in range(WARM_STEPS):
            backend.execute(timed)
        seconds = float(np.median([_seconds(backend, timed) for _ in range(TIMED_STEPS)]))
    for req in reqs:
        allocator.free(req)
    backend.execute(StepPlan(finished_req_ids=tuple(r.request_id for r in reqs)))  # the backend lets them go
    return plan, seconds


def _seconds(backend: Backend, plan: StepPlan) -> float:
    """One ``execute`` of ``plan``, timed as the engine times the backend's steps (its ``step_timer``)."""
    timer = STEP_TIMERS[backend.step_timer]
    start = timer()
    backend.execute(plan)
    return timer() - start


def typical_seconds(times: Sequence[float]) -> float:
    """What a step costs: the median of its timed repeats, the statistic the runs it is
    compared with report (a lower quartile, tried, predicted a quieter machine than a run's
    median steps meet: every step shape 5-20% fast)."""
    return float(np.median(times))


def lead_in(shape: Shape) -> Shape:
    """The decode step a run has just run before a step with a prompt chunk: its decodes (one
    sequence when it has none)."""
    return Shape(max(shape.decodes, 1), 0, 0, max(shape.context, 16))
