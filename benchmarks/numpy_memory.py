"""What the numpy backend's memory costs a step: huge-page heap growth, a lazily mapped KV pool,
K/V scattered over the pool.

Three diagnostics, the first two behind ``model/heap.py`` and ``NumpyOps.new_pool``
(docs/backends.md, "Does it predict the real backend?"), each in fresh processes, taking turns:

1. A long prompt prefilled in 512-token chunks on a fresh heap, then again: what each chunk
   of the first pays over the second (the heap grows the first time, once per chunk, as the
   chunks need ever larger score matrices), with numpy asking for transparent huge pages on
   large arrays (its default) and without (what the bound backend now does).
2. Page faults while every slot of a fresh KV pool is written once (what a run's steps do in
   time): the backend's pool against ``np.zeros`` (calloc's lazily mapped pages).
3. Decode steps with their sequences' K/V on consecutive blocks of a run-sized pool (as a
   fresh run hands them out and calibration times them) and on blocks handed out in a random
   order (as a long run's frees leave the free queue), alternating, the median of each: what
   the cost model, which prices K/V by bytes, does not see (with 4 MiB score slices, it moved
   no named run's replayed busy time by more than 1.5% when priced: docs/backends.md, "Which
   terms the CPU cost model keeps").

    .venv/bin/python benchmarks/numpy_memory.py [--rounds 3] [--tokens 4096]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys

import numpy as np

CHUNK = 512
BLOCK_SIZE = 16


def prompt_seconds(backend, allocator, req_id: int, token_ids: list[int], chunk: int) -> list[float]:
    """Prefill ``token_ids`` as one request in chunks of ``chunk`` tokens: each step's seconds
    (timed as calibration times a step: as the engine times the backend's)."""
    from paged_bench.calibration.shapes import _seconds
    from paged_bench.core.plan import NewRequestData, StepPlan
    from paged_bench.core.request import Request

    req = Request(req_id, 0.0, list(token_ids), 1)
    if not allocator.allocate_slots(req, len(token_ids)):
        raise ValueError(f"a {len(token_ids)}-token prompt does not fit the pool")
    seconds = []
    for start in range(0, len(token_ids), chunk):
        req.num_computed_tokens = start
        plan = StepPlan.starting([(NewRequestData.from_request(req, allocator.block_table(req)), chunk)])
        if start:
            plan = plan._replace(new_reqs=())  # the backend holds the request since its first chunk
        seconds.append(_seconds(backend, plan))
    allocator.free(req)
    backend.execute(StepPlan(finished_req_ids=(req_id,)))
    return seconds


def shuffled(num_blocks: int, rng: np.random.Generator):
    """An allocator over a pool of ``num_blocks`` that hands its blocks out in a random order:
    every block taken, then freed in a random order (its free queue's order from then on)."""
    from paged_bench.core.kv.paged import PagedAllocator
    from paged_bench.core.request import Request

    allocator = PagedAllocator(num_blocks=num_blocks, block_size=BLOCK_SIZE, prefix_caching=False, swap_blocks=0)
    fillers = [Request(-1 - i, 0.0, [0] * BLOCK_SIZE, 1) for i in range(num_blocks)]
    taken = [f for f in fillers if allocator.allocate_slots(f, BLOCK_SIZE)]
    for i in rng.permutation(len(taken)):
        allocator.free(taken[i])
    return allocator


def prompt_growth(huge_pages: bool, tokens: int) -> list[float]:
    """Per chunk of a ``tokens`` prompt, seconds its first prefill paid over its second."""
    from paged_bench.core.kv.paged import PagedAllocator
    from paged_bench.model import heap
    from paged_bench.run import registry

    backend = registry.create("backend", "numpy", model="small", threads=1)
    allocator = PagedAllocator(num_blocks=tokens // BLOCK_SIZE + 1, block_size=BLOCK_SIZE, prefix_caching=False,
                               swap_blocks=0)  # fmt: skip
    backend.bind(allocator)
    heap._set_numpy_huge_pages(huge_pages)  # bind turned it off; put numpy's default back to compare
    heap.trim()
    ids = np.random.default_rng(0).integers(0, backend.vocab_size, tokens).tolist()
    first = prompt_seconds(backend, allocator, 0, ids, CHUNK)
    again = prompt_seconds(backend, allocator, 1, ids, CHUNK)
    backend.close()
    return [a - b for a, b in zip(first, again)]


def pool_faults(lazy: bool) -> int:
    """Page faults while every slot of a fresh 64 MiB KV pool is written once."""
    from paged_bench.model.config import resolve_model
    from paged_bench.model.ops_numpy import NumpyOps

    made = NumpyOps(resolve_model("small")).new_pool(1 << 14)
    pool = np.zeros(made.shape, made.dtype) if lazy else made
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    pool[...] = 1.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


# (sequences, context, pool blocks): a long prompt's one-sequence decode and a few long ones
# in sim_vs_numpy's Azure pool, the seeds' batches in theirs
SCATTER_DECODES = ((1, 1536, 4096), (3, 1024, 4096), (4, 128, 512), (4, 128, 4096))


def scattered_decodes(rounds: int = 5) -> list[tuple[float, float]]:
    """Per ``SCATTER_DECODES`` shape, (ms on consecutive blocks, ms on blocks in a random order)."""
    from paged_bench.calibration.shapes import (
        TIMED_STEPS,
        WARM_STEPS,
        Shape,
        _continuing,
        _plan,
        _seconds,
    )
    from paged_bench.core.kv.paged import PagedAllocator
    from paged_bench.core.plan import StepPlan
    from paged_bench.run import registry

    backend = registry.create("backend", "numpy", model="small", threads=1)
    rng = np.random.default_rng(0)

    def step_ms(sequences: int, context: int, pool_blocks: int, scattered: bool) -> float:
        # a fresh allocator each time: consecutive blocks from the first, or all in a random order
        if scattered:
            allocator = shuffled(pool_blocks, rng)
        else:
            allocator = PagedAllocator(num_blocks=pool_blocks, block_size=BLOCK_SIZE, prefix_caching=False,
                                       swap_blocks=0)  # fmt: skip
        backend.bind(allocator)
        plan, reqs = _plan(Shape(sequences, 0, 0, context), allocator, rng, backend.vocab_size)
        backend.execute(plan)
        timed = _continuing(plan)
        for _ in range(WARM_STEPS):  # as calibration times a decode batch
            backend.execute(timed)
        seconds = float(np.median([_seconds(backend, timed) for _ in range(TIMED_STEPS)]))
        backend.execute(StepPlan(finished_req_ids=tuple(r.request_id for r in reqs)))
        return seconds * 1e3

    results = []
    for shape in SCATTER_DECODES:
        pairs = [(step_ms(*shape, scattered=False), step_ms(*shape, scattered=True)) for _ in range(rounds)]
        results.append(tuple(float(np.median(side)) for side in zip(*pairs)))
    backend.close()
    return results


def child(what: str, tokens: int) -> None:
    if what == "scatter":
        print("; ".join(f"{n} x {ctx} tokens of {blocks} blocks: {a:.2f} -> {b:.2f} ms ({b / a - 1:+.0%})"
                        for (n, ctx, blocks), (a, b) in zip(SCATTER_DECODES, scattered_decodes())))  # fmt: skip
    elif what.startswith("growth"):
        extra = prompt_growth(what == "growth-huge", tokens)
        print(" ".join(f"{s * 1e3:.0f}" for s in extra), f"| total {sum(extra) * 1e3:.0f}")
    else:
        pool = np.zeros(1)  # noqa: F841 (numpy loaded before the count starts)
        print(pool_faults(what == "pool-lazy"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=4096, help="the long prompt (a multiple of 512)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.tokens)
        return
    labels = {
        "growth-huge": "ms more per chunk, huge pages (numpy's default)",
        "growth-4k": "ms more per chunk, 4 KiB pages (the bound backend)",
        "pool-lazy": "page faults writing a fresh np.zeros pool",
        "pool-made": "page faults writing a fresh NumpyOps.new_pool pool",
        "scatter": "decode steps, K/V on consecutive blocks -> on blocks in a random order",
    }
    for round_no in range(args.rounds):
        for what, label in labels.items():
            cmd = [sys.executable, __file__, "--child", what, "--tokens", str(args.tokens)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
            print(f"round {round_no + 1}: {label}: {out}", flush=True)


if __name__ == "__main__":
    main()
