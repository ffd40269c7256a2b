"""The comparison as a terminal table and as ``docs/validation.md``.

Both are made from the same rows: each published figure, what the simulator gave, and their
ratio (simulated / published). The summary is the share within 15% and the median absolute
error (|ratio - 1|) over every figure that simulated. The markdown also names every source,
how each figure was read, the overrides each case ran with, and, from each case file's
``notes`` and the rows themselves, where the simulator is still off and why.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from paged_bench.errors import counted
from paged_bench.validate.bursts import burst_table
from paged_bench.validate.cases import FIGURE_REF, SourceFile, quoted_figures
from paged_bench.validate.simulate import DRAWS_AT_ONCE, Compared, draw_seeds
from paged_bench.validate.workloads import request_lengths
from paged_bench.workloads.sharegpt import (
    MAX_PROMPT,
    MAX_TOTAL,
    MEANS_WITHIN,
    MIN_TOKENS,
    sharegpt_kept,
    sharegpt_table,
)

TOLERANCE = 0.15  # a figure this close (|ratio - 1|) counts as met
COMMAND = "python -m paged_bench.validate --write docs/validation.md"


@dataclass(frozen=True)
class Totals:
    figures: int
    failed: int
    within: int  # |ratio - 1| <= TOLERANCE
    median_error: float | None  # of |ratio - 1|, over the figures that simulated


SHARED = "shared_"  # a case file named so holds cases the shared README lists; the rest are kept aside


def totals(rows: Sequence[Compared]) -> Totals:
    errors = [abs(r.ratio - 1) for r in rows if r.ratio is not None]
    return Totals(len(rows), len(rows) - len(errors), sum(e <= TOLERANCE for e in errors),
                  statistics.median(errors) if errors else None)  # fmt: skip


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value < 10 else f"{value:.1f}"


def _ratio(row: Compared) -> str:
    """The ratio, and its range over the case's draws where it has several: "0.95 (0.77-1.12)"."""
    if row.ratio is None:
        return "failed"
    spread = row.ratio_range
    return f"{row.ratio:.2f}" + (f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread else "")


def summary_line(t: Totals) -> str:
    median = "-" if t.median_error is None else f"{t.median_error:.1%}"
    failed = f", {t.failed} failed" if t.failed else ""
    return (f"{counted(t.figures, 'figure')}: {t.within} within {TOLERANCE:.0%} of the published value; "
            f"median absolute error {median}{failed}")  # fmt: skip


def terminal_table(rows: Sequence[Compared]) -> str:
    """Case, metric, published, simulated, ratio: one row a figure, then the summary line and
    each failed case's error."""
    head = ("case", "metric", "unit", "published", "simulated", "ratio")
    body = [(r.case.name, r.figure.metric, r.figure.unit, _num(r.figure.published), _num(r.simulated), _ratio(r))
            for r in rows]  # fmt: skip
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
             for line in (head, *body)]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(summary_line(totals(rows)))
    for metric, group in _metric_groups(rows):  # which way each kind of figure leans
        ratios = [r.ratio for r in group if r.ratio is not None]
        lean = f", median ratio {statistics.median(ratios):.2f}" if ratios else ""
        lines.append(f"  {metric}: {totals(group).within} of {len(group)} within {TOLERANCE:.0%}{lean}")
    failed = {r.case.name: r.error for r in rows if r.error}
    lines += [f"error: {name}: {error}" for name, error in failed.items()]
    return "\n".join(lines)


def _workload_text(row: Compared) -> str:
    w = row.case.workload
    rate = "all at once" if math.isinf(w.rate) else f"{w.rate:g} req/s"
    if w.dataset == "sharegpt":  # the draws' means beside the published ones
        seeds = draw_seeds(row.case)
        drawn = sum(request_lengths(w, seed).mean(axis=0) for seed in seeds) / len(seeds)
        draws = f", {len(seeds)} draws" if len(seeds) > 1 else ""
        lengths = (f"ShareGPT, mean {drawn[0]:.0f} in / {drawn[1]:.0f} out (published {w.prompt_len} / "
                   f"{w.output_len}){draws}")  # fmt: skip
    elif w.dataset == "listed":
        lengths = (f"the published requests, mean {statistics.fmean(w.prompt_lens):.0f} in / "
                   f"{statistics.fmean(w.output_lens):.0f} out")  # fmt: skip
    else:
        lengths = f"{w.prompt_len} in / {w.output_len} out"
    return f"{w.num_requests} x {lengths}, {rate}"


def _by_file(files: Sequence[SourceFile], rows: Sequence[Compared]) -> list[str]:
    """The rows summed up by case file: where the misses are, and which way."""
    return _breakdown([(f"`{f.name}`", [r for r in rows if r.case.file == f.name]) for f in files])


def _metric_groups(rows: Sequence[Compared]) -> list[tuple[str, list[Compared]]]:
    """Each metric with its rows over every file, the metrics in the order they first come."""
    return [(m, [r for r in rows if r.figure.metric == m]) for m in dict.fromkeys(r.figure.metric for r in rows)]


def _by_metric(rows: Sequence[Compared]) -> list[str]:
    """The rows summed up by metric over every file: how far each kind of figure can be trusted, and which way
    it leans."""
    return _breakdown(_metric_groups(rows))


def _breakdown(groups: Sequence[tuple[str, Sequence[Compared]]]) -> list[str]:
    """A table row for each labelled group of rows: its figures, how many within 15%, the median error and ratio."""
    out = ["| figures of | figures | within 15% | median abs. error | median ratio |", "|---|---:|---:|---:|---:|"]
    for label, group in groups:
        if group:
            t = totals(group)
            ratios = [r.ratio for r in group if r.ratio is not None]
            median = "-" if t.median_error is None else f"{t.median_error:.1%}"
            mid = f"{statistics.median(ratios):.2f}" if ratios else "-"
            out.append(f"| {label} | {t.figures} | {t.within} | {median} | {mid} |")
    return out


def _outside(files: Sequence[SourceFile], rows: Sequence[Compared]) -> list[str]:
    """Every figure outside the tolerance (or failed), a row each: the shared README's cases first,
    then file by file, so the issue's own misses are read before the ones kept aside."""
    off = [r for r in rows if r.ratio is None or abs(r.ratio - 1) > TOLERANCE]
    if not off:
        return [f"Figures outside ±{TOLERANCE:.0%}: none."]
    out = [f"{counted(len(off), 'figure')} outside ±{TOLERANCE:.0%}, the shared README's cases first:", "",
           "| file | case | metric | published | simulated | ratio |", "|---|---|---|---:|---:|---:|"]  # fmt: skip
    for f in sorted(files, key=lambda f: not f.name.startswith(SHARED)):  # sorted() keeps the name order within
        out += [f"| `{f.name}` | {r.case.name} | {r.figure.metric} ({r.figure.unit}) | {_num(r.figure.published)} "
                f"| {_num(r.simulated)} | {_ratio(r)} |" for r in off if r.case.file == f.name]  # fmt: skip
    return out


def _workloads_text() -> str:
    """How the cases' requests are made (paged_bench.validate.workloads)."""
    table, kept = sharegpt_table(), sharegpt_kept()
    return (
        "Workloads: where a source used ShareGPT, the requests are drawn from ShareGPT lengths shipped with "
        f"paged_bench (paged_bench/data/lengths/: {len(table)} conversations of ShareGPT_V3_unfiltered_cleaned_split, "
        "a published random sample, counted in Llama 3 tokens as vLLM counts them; its README gives the source and "
        "licence), the rows vLLM's sampler keeps (`sample_sharegpt_requests`, vllm-project/vllm "
        f"`benchmarks/benchmark_serving.py`, tag v0.6.0: a prompt or output under {MIN_TOKENS} tokens, a prompt "
        f"over {MAX_PROMPT:,} or a prompt + output over {MAX_TOTAL:,} is dropped; {len(kept)} kept, mean "
        f"{kept[:, 0].mean():.0f} in / {kept[:, 1].mean():.0f} out), each output exactly its completion's length "
        "(max_tokens, and vLLM's nightly benchmark passes --ignore-eos). vLLM's sampler takes the first N of ~90,000 "
        "shuffled conversations that pass, in effect N independent draws of the population, and the source gives "
        "its requests' mean lengths but not which conversations its seed took: so N rows are drawn independently "
        f"(with replacement) from the kept rows until the draw's mean prompt and output are each within "
        f"{MEANS_WITHIN:.1%} of the published means (`paged_bench.workloads.sharegpt.sharegpt_with_means`). With "
        "every request at once a run lasts until its longest request ends, so which conversations were drawn "
        f"sets its figures: those cases run on {DRAWS_AT_ONCE} draws, the simulated figure is their mean and the "
        "ratio column gives the range over the draws in brackets. The workload column gives the draws' means beside "
        "the published ones. The sonnet "
        "sets of vLLM's posts are modelled as fixed lengths at their published averages. Where a source lists each "
        "request's prompt and output tokens (a benchmark_serving.py result file), its requests are sent as listed "
        "(dataset `listed`), a reply of 0 tokens as one token whose TTFT the figures count as 0, as vLLM's client "
        "did. Arrivals are vLLM's "
        "benchmark client's: all at once (QPS inf), or Poisson at the QPS with the very gaps its client draws "
        "with its default --seed 0 (np.random.seed(0), then np.random.exponential(1 / QPS) after each request)."
    )


def _quoted(text: str, rows: Sequence[Compared]) -> str:
    """A note with each figure it quotes (cases.FIGURE_REF) as this run gave it: a ratio as "1.02x", several
    as "0.94x to 1.10x", a simulated figure as in the table; "-" where one did not run (--case) or failed."""
    by_figure = {(r.case.name, r.figure.metric): r for r in rows}

    def value(ref: re.Match[str]) -> str:
        quoted = [by_figure.get(key) for key in quoted_figures(ref)]
        ratios = [row.ratio for row in quoted if row is not None and row.ratio is not None]
        if len(ratios) < len(quoted):
            return "-"
        if ref[1] == "simulated":
            return _num(quoted[0].simulated)
        return f"{min(ratios):.2f}x" + (f" to {max(ratios):.2f}x" if len(ratios) > 1 else "")

    return FIGURE_REF.sub(value, text)


def markdown(files: Sequence[SourceFile], rows: Sequence[Compared]) -> str:
    """docs/validation.md, whole."""
    t = totals(rows)
    out = [
        "# Validation: the simulator against published real-GPU runs",
        "",
        f"<!-- generated by `{COMMAND}` (make validate); edit conf/validation/*.yaml, not this file -->",
        "",
        ("Each case below is a run someone published from a real GPU. `python -m paged_bench.validate` "
        "replays its workload through the simulator (`backend=sim`, in-process, through the same job code "
        "as `python -m paged_bench`), with the overrides that describe the engine the source measured, and "
        "compares each published figure with the simulated one: ratio = simulated / published. Nothing "
        "in the simulator is fitted to these figures; they judge it."),
        "",
        (f"**{summary_line(t)}.** The files named `shared_*` hold the cases the issue's shared "
        "README lists (issue 35: each to come within 15%); the others are kept aside to judge the result "
        f"(those alone: {summary_line(totals([r for r in rows if not r.case.file.startswith(SHARED)]))})."),
        "",
        "## At a glance",
        "",
        ("Each metric over every case file: how many of its figures land within 15% and which way the simulator "
         "leans (median ratio: above 1 it gives more than was published). Where the simulator is still off, case by "
         "case and why: the section of that name, after the table of results."),
        "",
        *_by_metric(rows),
        "",
        _workloads_text(),
        "",
        "## Results",
        "",
        "| case | GPU | model | TP | workload | metric | published | simulated | ratio |",
        "|---|---|---|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        c = r.case
        out.append(f"| {c.name} | {c.gpu} | {c.model} | {c.tp} | {_workload_text(r)} | {r.figure.metric} "
                   f"({r.figure.unit}) | {_num(r.figure.published)} | {_num(r.simulated)} | {_ratio(r)} |")  # fmt: skip
    out += ["", "## Where the simulator is still off, and why", "", *_by_file(files, rows), "",
            *_outside(files, rows), ""]  # fmt: skip
    bursts = burst_table(rows)
    if bursts:
        out += [("Every request at once, fixed lengths: what the published TTFT and throughput say on their own "
                "(`paged_bench/validate/bursts.py`: vLLM 0.x runs prompt steps first, so with every request at the "
                "engine by time L the mean TTFT is about L + P / 2 and the run lasts at least L + P, P the prefill "
                "phase: L >= 2 x TTFT - D and the prefill rate >= prompt tokens / (2 (D - TTFT)), D the run's "
                "duration; the simulated columns are the same arithmetic on the simulated figures; the cells whose "
                "published figures bound the delay):"), "", *bursts, ""]  # fmt: skip
    for f in files:
        if f.notes:
            out += [f"### Notes on {f.name}", ""]
            out += [(f"**{n.heading}.** " if n.heading else "") + _quoted(n.text, rows) + "\n" for n in f.notes]
    out += ["## Sources", ""]
    for f in files:
        setup = " ".join(f"`{o}`" for o in f.setup) or "(none)"
        out += [f"### {f.name}", "", f"- Source: {f.source.citation}", f"- Engine: {f.engine}",
                f"- Every case runs `python -m paged_bench` with {setup}"]
        for c in f.cases:
            own = c.overrides[len(f.setup) :]
            more = f"; and {' '.join(f'`{o}`' for o in own)}" if own else ""
            out.append(f"- `{c.name}` ({c.where or 'the source'}): {c.gpu}, {c.model}, TP {c.tp}{more}")
            out += [f"  - {fig.metric} {_num(fig.published)} {fig.unit}: {fig.read}" for fig in c.figures]
        out.append("")
    return "\n".join(out).rstrip() + "\n"
