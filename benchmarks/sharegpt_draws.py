"""How much a ShareGPT validation figure rests on which requests were drawn (issue 35).

``python -m paged_bench.validate`` draws a ShareGPT case's requests from the shipped table with the
published mean lengths (``paged_bench.workloads.sharegpt.sharegpt_with_means``); vLLM's own run
drew 500 other conversations of the same dataset. With every request at once the run lasts until
its longest request ends, so validate takes the mean over ``DRAWS_AT_ONCE`` draws. This runs the
registry's ShareGPT cases with every request at once (or the cases named) on each draw alone and
prints, a draw a line, its longest output and mean lengths and each figure's ratio (simulated /
published), so the spread a draw alone makes is on record.

``--pin-lambda``: the 0.6.0 post's first 320 requests are known. Its client (benchmark_serving.py,
seed 0, Llama 3's tokenizer) sent the first N conversations its shuffle kept, and Lambda's result
files (conf/validation/lambda_vllm060_sharegpt.yaml) list the first 320 of that very sequence, each
request's prompt tokens exact. Their outputs stopped at the model's end of text (no --ignore-eos), so
a request's completion length (its max_tokens, all the post's run generated with --ignore-eos) is
at least the longest output any of Lambda's twelve 320-request runs gave it. With it, each draw
sends those 320 requests first, at that length, then 180 rows drawn from the table's kept rows
(no means matched: what the post's means say of them is printed first). Only the post's cases
are pinned so (SGLang's client has a seed of its own).

    python benchmarks/sharegpt_draws.py [--seeds 12] [--case NAME ...] [--pin-lambda]
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import numpy as np

from paged_bench.validate.cases import Case, Workload, load_registry
from paged_bench.validate.simulate import run_case
from paged_bench.validate.workloads import request_lengths
from paged_bench.workloads.sharegpt import sharegpt_kept

LAMBDA_FILE = "lambda_vllm060_sharegpt.yaml"
LAMBDA_REQUESTS = 320
POST_FILES = ("shared_vllm060_perf_post", "vllm060_perf_post")  # the 0.6.0 post's cases (its client, seed 0)


def lambda_first_requests(cases: list[Case]) -> tuple[np.ndarray, int]:
    """The first 320 requests of vLLM's seed-0 ShareGPT sample as (prompt_len, least completion
    length) rows, from the Lambda runs that list them, and how many requests every run, 8B and
    70B, ended at the same length past 0 (the mark of a reply cut at its max_tokens: that length
    is exact)."""
    runs = [c.workload for c in cases if c.file == LAMBDA_FILE and c.workload.num_requests == LAMBDA_REQUESTS]
    prompts = {w.prompt_lens for w in runs}
    if len(prompts) != 1:
        raise SystemExit(f"error: {LAMBDA_FILE}'s {LAMBDA_REQUESTS}-request runs do not list the same prompts")
    outputs = np.array([w.output_lens for w in runs])  # (run, request)
    same = int(np.sum((outputs.min(axis=0) == outputs.max(axis=0)) & (outputs.max(axis=0) > 0)))
    return np.column_stack([prompts.pop(), np.maximum(outputs.max(axis=0), 1)]), same


def pinned_workload(workload: Workload, first: np.ndarray, seed: int) -> Workload:
    """``workload``'s requests as the known first rows, then independent draws of the kept rows."""
    kept = sharegpt_kept()
    rest = kept[np.random.default_rng(seed).integers(0, len(kept), workload.num_requests - len(first))]
    lengths = np.concatenate([first, rest])
    return dataclasses.replace(workload, dataset="listed", prompt_lens=tuple(int(p) for p in lengths[:, 0]),
                               output_lens=tuple(int(o) for o in lengths[:, 1]))  # fmt: skip


def describe_pin(first: np.ndarray, same: int, published: Workload) -> str:
    """What the known first requests say of the published means."""
    n, rest = published.num_requests, published.num_requests - len(first)
    rest_in = (published.prompt_len * n - first[:, 0].sum()) / rest
    rest_out = (published.output_len * n - first[:, 1].sum()) / rest
    kept_out = sharegpt_kept()[:, 1]
    below = (kept_out.mean() - rest_out) / (kept_out.std() / math.sqrt(rest))  # standard errors of a mean of `rest`
    return (f"the first {len(first)} requests: mean prompt {first[:, 0].mean():.1f}, completion at least "
            f"{first[:, 1].mean():.1f} ({same} ended at one length past 0 in every run); the published means "
            f"{published.prompt_len} / {published.output_len} over {n} leave the other {rest} "
            f"{rest_in:.1f} in / at most {rest_out:.1f} out, {below:.1f} standard errors under the kept rows' "
            f"mean output {kept_out.mean():.0f} (sd {kept_out.std():.0f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=12, help="draws 0 .. N-1 (0 is the registry's)")
    parser.add_argument("--case", action="append", help="a case name (default: ShareGPT cases at QPS inf)")
    parser.add_argument("--pin-lambda", action="store_true", help="the first 320 requests as Lambda's files list them")
    args = parser.parse_args()
    every = [c for f in load_registry() for c in f.cases]
    cases = [c for c in every if c.workload.dataset == "sharegpt"
             and (c.name in args.case if args.case else math.isinf(c.workload.rate))
             and (not args.pin_lambda or c.file.startswith(POST_FILES))]  # fmt: skip
    if not cases:
        parser.error(f"no ShareGPT case named {args.case}")
    first = None
    if args.pin_lambda:
        first, same = lambda_first_requests(every)
        print(describe_pin(first, same, cases[0].workload))
    print("seed  longest out  mean in/out  " + "  ".join(f"{c.name} ({'/'.join(f.metric for f in c.figures)})"
                                                        for c in cases))  # fmt: skip
    for seed in range(args.seeds):
        drawn = cases if first is None else [
            dataclasses.replace(c, workload=pinned_workload(c.workload, first, seed)) for c in cases]  # fmt: skip
        cells = []
        for case in drawn:
            rows = run_case(case, time_limit_s=300, seeds=[seed])
            cells.append("/".join("failed" if r.ratio is None else f"{r.ratio:.2f}" for r in rows))
        lengths = request_lengths(drawn[0].workload, seed)
        print(f"{seed:4d}  {lengths[:, 1].max():11d}  {lengths[:, 0].mean():5.0f}/{lengths[:, 1].mean():<5.0f}  "
              + "  ".join(cells), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
