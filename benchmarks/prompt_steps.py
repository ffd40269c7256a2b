"""vLLM 0.6.0's prompt steps on real GPUs, one by one, beside the simulator's (issue 35).

With every request sent at once, vLLM 0.x runs its prompt steps back to back before any decode,
and every request of one step gets its first token at the same moment: the TTFTs of a run's
result file come in groups, one a prompt step. Lambda's twelve 320-request runs
(conf/validation/lambda_vllm060_sharegpt.yaml; their TTFTs in benchmarks/data/lambda_vllm060_ttfts.json)
so time vLLM's prompt steps on 1 to 8 H100s and A100s, Llama 3 8B and 70B, steps of up to 2,048
tokens. This groups the published TTFTs and the simulated run's (the same case, as
``python -m paged_bench.validate`` runs it) the same way and prints, a run a row:

- groups: prompt steps seen (a step's outputs that reached the client in two parts, closer than a
  quarter of the median gap, count once; the steps end at the first gap over twice the median, a
  decode window);
- first: when the first group came back (the front end's intake, one step and the hand-over);
- span: from the first group to the last (the steps after the first), and its ratio sim / real;
- per step: the span over the gaps in it;
- tokens/s: the prompt tokens of the requests whose first tokens came back inside the span, over
  the span (the empty replies have no TTFT to place them: left out of both sides alike).

    .venv/bin/python benchmarks/prompt_steps.py [--case NAME ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paged_bench.errors import ConfigError
from paged_bench.validate.cases import Case, chosen_cases, load_registry
from paged_bench.validate.simulate import SEED, client_ttfts_ms, run_draw

DATA = Path(__file__).parent / "data" / "lambda_vllm060_ttfts.json"
ONE_STEP_S = 0.005  # first tokens this close came from one step (a step takes 10 ms or more here)


@dataclass(frozen=True)
class PromptSteps:
    """One run's prompt steps, read off its requests' TTFTs."""

    starts: np.ndarray  # when each group of first tokens came back, seconds after the burst
    tokens_in_span: int  # prompt tokens of the requests placed after the first group

    @property
    def span(self) -> float:
        return float(self.starts[-1] - self.starts[0])

    @property
    def per_step(self) -> float:
        return self.span / (len(self.starts) - 1)


def prompt_steps(ttfts: np.ndarray, prompt_lens: np.ndarray) -> PromptSteps:
    """The groups of ``ttfts`` (0: no first token to place) and the prompt tokens inside them."""
    placed = np.sort(ttfts[ttfts > 0])
    groups = placed[np.r_[True, np.diff(placed) >= ONE_STEP_S]]
    if len(groups) < 3:  # a gap's median needs two gaps; a run of every request at once has dozens
        raise ConfigError("TTFTs", f"{len(groups)} group(s) of first tokens", "three or more (prompt steps)")
    typical = statistics.median(np.diff(groups))
    starts = [groups[0]]
    for start in groups[1:]:
        if start - starts[-1] < typical / 4:  # one step's outputs, handed over in two parts
            continue
        if start - starts[-1] > 2 * typical:  # a decode window: the prompt steps are over
            break
        starts.append(start)
    inside = (ttfts > starts[0] + ONE_STEP_S) & (ttfts <= starts[-1] + ONE_STEP_S)
    return PromptSteps(np.array(starts), int(prompt_lens[inside].sum()))


def simulated_ttfts(case: Case) -> np.ndarray:
    """Each request's simulated TTFT (s) as the client takes it: 0 where the published reply was empty."""
    with tempfile.TemporaryDirectory(prefix="paged_bench_steps_") as tmp:
        records = run_draw(case, SEED, Path(tmp)).records
    assert records is not None  # an engine run's records are its requests
    return np.nan_to_num(client_ttfts_ms(records, case.workload) / 1e3)  # a failed request: no first token


def row(case: Case, published: list[float]) -> str:
    if len(published) != case.workload.num_requests:
        raise ConfigError(f"{DATA.name} {case.name}", f"{len(published)} TTFTs",
                          f"one a request: {case.workload.num_requests}")  # fmt: skip
    prompts = np.asarray(case.workload.prompt_lens)
    real = prompt_steps(np.asarray(published), prompts)
    sim = prompt_steps(simulated_ttfts(case), prompts)
    rate_real, rate_sim = real.tokens_in_span / real.span, sim.tokens_in_span / sim.span
    return (f"| {case.name} | {case.gpu} | {case.model} | {case.tp} | {len(real.starts)} / {len(sim.starts)} "
            f"| {real.starts[0]:.3f} / {sim.starts[0]:.3f} | {real.span:.3f} / {sim.span:.3f} ({sim.span / real.span:.2f}x) "
            f"| {real.per_step * 1e3:.1f} / {sim.per_step * 1e3:.1f} ({sim.per_step / real.per_step:.2f}x) "
            f"| {rate_real:,.0f} / {rate_sim:,.0f} ({rate_sim / rate_real:.2f}x) |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", help="a case of the TTFT file (default: all twelve)")
    args = p.parse_args(argv)
    runs = json.loads(DATA.read_text())["runs"]
    try:
        unknown = sorted(set(args.case or ()) - set(runs))
        if unknown:
            raise ConfigError("--case", ", ".join(unknown), f"a run of {DATA.name}: {', '.join(runs)}")
        cases = chosen_cases(load_registry(), args.case or list(runs))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print("published / simulated; ratios simulated / published")
    print("| case | GPU | model | TP | groups | first (s) | span (s) | per step (ms) | prompt tokens/s in the span |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        print(row(case, runs[case.name]["ttfts"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
