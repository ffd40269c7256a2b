"""The capacity planner (python -m paged_bench.plan): a planted answer found, to the rate
search's precision, with the pruning it claims; a small real plan end to end (its winner rerun
as a plain command meets the SLO, a rerun reuses every simulation); bad plans refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from paged_bench.capacity.launch import subdir_override
from paged_bench.capacity.planner import run_plan
from paged_bench.capacity.search import RateSearch, SearchSettings
from paged_bench.capacity.slo import Broken, Slo, Watch
from paged_bench.capacity.space import Candidate, candidates
from paged_bench.tracking.runs import KIND_TAG, PARENT_TAG
from tests.tracking_support import call_cli, fresh_store, runs_of

PRICES = {"a100": {"usd_per_gpu_hour": 1.0}, "h100": {"usd_per_gpu_hour": 2.5}, "h200": {"usd_per_gpu_hour": 3.0}}
SPACE = {"hardware": ["a100", "h100", "h200"], "tensor_parallel_size": [1, 2, 4], "replicas": [1, 2, 3, 4],
         "prefill_decode": ["1+1", "1+2"], "max_batch": [64], "max_num_batched_tokens": [512], "router": ["rr"]}  # fmt: skip
SPEED = {"a100": 1.0, "h100": 3.1, "h200": 3.6}  # capacity per GPU, planted


def planted(c: Candidate) -> float:
    """The test's cost model: capacity per GPU by type, TP a little sublinear, a split 10% better."""
    return SPEED[c.hardware] * c.num_gpus * (0.9 ** math.log2(c.tensor_parallel_size)) * (1.1 if c.prefill else 1.0)


def refuses(c: Candidate) -> str | None:
    return "weights do not fit: planted" if c.tensor_parallel_size == 1 and c.hardware == "a100" else None


def test_the_plan_finds_the_planted_answer_to_the_searchs_precision():
    cands = candidates(SPACE, PRICES)
    settings = SearchSettings(target=10.0, precision=0.05, min_scale=0.5, max_scale=64)
    calls = []

    def runner(steps):
        calls.extend(steps)
        return [{"scale": s, "passed": s <= planted(e.candidate), "figures": {}} for e, s in steps]

    result = run_plan(cands, settings, runner, refuses, wave=3)
    fits = [c for c in cands if refuses(c) is None]
    best = min((c for c in fits if planted(c) >= 10.0), key=lambda c: c.usd_per_hour)
    assert result.winner is not None and result.winner.candidate.usd_per_hour == best.usd_per_hour
    assert planted(result.winner.candidate) >= 10.0
    # every candidate cheaper than the winner was simulated and does not serve the target
    cheaper = [e for e in result.entries if e.candidate.usd_per_hour < best.usd_per_hour and not refuses(e.candidate)]
    assert cheaper and all(e.measured and e.search.meets(10.0) is False for e in cheaper)
    for e in result.entries:  # a finished search brackets the planted capacity within the precision
        if e.measured and e.pruned is None and e.search.lo is not None and e.search.hi is not None:
            assert e.search.lo <= planted(e.candidate) < e.search.hi <= e.search.lo * 1.05 + 1e-9, e.candidate.label
    counts = result.pruned_counts()
    assert counts["weights do not fit"] == sum(refuses(c) is not None for c in cands)
    assert counts["costs more"] > 0 and counts["dominated"] > 0
    assert len(calls) < 4 * len(fits)  # pruning saved simulations: fewer than four per buildable candidate
    assert not [s for e, s in calls if refuses(e.candidate)]  # nothing refused was simulated


def test_the_rate_search_brackets_to_its_precision():
    search = RateSearch(SearchSettings(target=4.0, precision=0.02, min_scale=0.1, max_scale=100))
    while (scale := search.next_scale()) is not None:
        search.record(scale, scale <= 7.3)
    assert search.lo <= 7.3 < search.hi <= search.lo * 1.02
    assert len(search.tried) <= 10  # doubling to a bracket, then bisection: not a grid
    # a guess that holds (a neighbour's bracket, scaled) ends it in three; a wrong one still brackets
    for guess, most in (((7.0, 7.5), 3), ((20.0, 21.0), 12)):
        search = RateSearch(SearchSettings(target=4.0, precision=0.1, min_scale=0.1, max_scale=100), guess=guess)
        while (scale := search.next_scale()) is not None:
            search.record(scale, scale <= 7.3)
        assert search.lo <= 7.3 < search.hi <= search.lo * 1.1 and len(search.tried) <= most, search.tried


def test_a_run_stops_once_its_percentile_cannot_be_met_a_ttft_as_its_deadline_passes():
    class Req:
        def __init__(self, arrival, ttft):
            self.arrival_time, self.num_prompt_tokens, self.is_finished = arrival, 10, False
            self.token_times = [] if ttft is None else [arrival + ttft, arrival + ttft + 0.01]

    # one request every 10 ms: the first 11 get their first token 200 ms late, then all in 50 ms,
    # but for the 12th, still waiting; one too long to be served, and one rejected
    reqs = [Req(i / 100, 0.2 if i < 11 else None if i == 11 else 0.05) for i in range(100)]
    reqs[20].num_prompt_tokens = 500  # refused at the door (max_model_len 100): no TTFT
    reqs[30].token_times, reqs[30].is_finished = [], True  # ended with no token: no TTFT
    clock = [0.205]  # the run's own time, behind what a replica's step reports
    watch = Watch(Slo.from_config({"ttft_p90_ms": 100}), reqs, max_model_len=100, now=lambda: clock[0])
    watch.on_step(9.0, [])  # 11 of 100 over: p90 could still be met (interpolation)
    assert watch.broken is None and watch.over == [11]  # the 12th's deadline is not past by the run's clock
    clock[0] = 5.0
    try:  # (pytest.raises lets a KeyboardInterrupt through: it stops the session)
        watch.on_step(5.0, [])  # every deadline past: the 12th is over; the 20th and 30th have no TTFT
    except Broken:
        pass
    assert watch.broken is not None and watch.broken.startswith("ttft_p90_ms: 12 requests")


def test_a_trials_folder_is_its_key_whatever_hydra_would_read_it_as():
    for key in ("3e51234567890123", "0123456789012345", "00c0ffee00c0ffee"):  # a float (inf), an int, a string
        assert OverridesParser.create().parse_override(subdir_override(key)).value() == key


SMALL = ("workload=poisson", "workload.num_requests=120", "backend.model=llama-3-8b",
         "plan.space.hardware=[a100,h100]", "plan.space.tensor_parallel_size=[1]", "plan.space.replicas=[1,2]",
         "plan.target_scale=4", "plan.search.precision=0.1", "plan.wave=8")  # fmt: skip


def _plan(tmp_path: Path, *extra: str):
    return call_cli(tmp_path, *SMALL, f"plan.trials_dir={tmp_path / 'trials'}", *extra, module="paged_bench.plan")


def test_a_small_plan_end_to_end_and_its_rerun_reuses_every_simulation(tmp_path):
    uri = fresh_store(tmp_path)  # the session's migrated store, copied: no migrations run here
    first = _plan(tmp_path, "hydra.run.dir=first", f"tracking.uri={uri}", "experiment_name=plan")
    assert first.returncode == 0, first.stderr
    record = json.loads((tmp_path / "first" / "plan.json").read_text())
    _, runs = runs_of(uri, "plan")  # one parent, a child per simulated candidate
    (parent,) = [r for r in runs if r.data.tags[KIND_TAG] == "plan"]
    children = [r for r in runs if r.data.tags.get(PARENT_TAG) == parent.info.run_id]
    assert len(children) == sum(bool(c["trials"]) for c in record["candidates"]) == len(runs) - 1
    assert parent.data.tags["winner"] == record["winner"]["label"]
    assert record["num_trials"] > 0 and record["num_reused"] == 0 and record["winner"]
    assert (tmp_path / "first" / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    command = next(
        line.strip() for line in first.stdout.splitlines() if line.strip().startswith("python -m paged_bench ")
    )
    again = _plan(tmp_path, "hydra.run.dir=again", "tracking.enabled=false")
    rerun = json.loads((tmp_path / "again" / "plan.json").read_text())
    assert again.returncode == 0 and rerun["num_trials"] == 0 and rerun["num_reused"] == record["num_trials"]
    assert rerun["winner"]["label"] == record["winner"]["label"]
    # the winner, as a plain run at the target load, meets the SLO
    assert f"tracking.uri={uri}" in command  # the plan's settings, said to the plain command
    plain = call_cli(tmp_path, *command.split()[3:], "hydra.run.dir=winner", "tracking.enabled=false")
    assert plain.returncode == 0, plain.stderr
    summary = json.loads((tmp_path / "winner" / "summary.json").read_text())
    assert summary["p90_ttft_ms"] <= 500 and summary["p99_tpot_ms"] <= 50
    # ... and the next-cheaper candidate, run the same way, does not
    cheaper = call_cli(tmp_path, *record["next_cheaper"]["command"].split()[3:], "hydra.run.dir=cheaper",
                       "tracking.enabled=false")  # fmt: skip
    assert cheaper.returncode == 0, cheaper.stderr
    summary = json.loads((tmp_path / "cheaper" / "summary.json").read_text())
    assert summary["p90_ttft_ms"] > 500 or summary["p99_tpot_ms"] > 50


@pytest.mark.parametrize(("override", "line"), [
    ("plan.space.hardware=[a100,x100]", "error: plan.space.hardware='x100' is not allowed: roofline hardware presets"),
    ("plan.space.hardware=[b200]", "error: plan.prices.b200.usd_per_gpu_hour=None is not allowed: a price"),
    ("plan.space.replicas=[]", "error: plan.space.replicas=[] is not allowed: a non-empty list"),
    ("plan.slo.ttft_p90_ms=0.001", "error: plan.slo={TTFT p90 <= 0.001 ms, TPOT p99 <= 50 ms} is not met at plan.target_scale=4"),
])  # fmt: skip
def test_a_bad_plan_is_one_line_naming_its_key(tmp_path, override, line):
    # the unmeetable SLO: one candidate, its search down to half the target (two simulations, each stopped early)
    unmet = ("plan.space.hardware=[h100]", "plan.space.replicas=[1]", "plan.search.min_scale=2")
    ran = _plan(tmp_path, override, "tracking.enabled=false", *(unmet if "slo" in override else ()))
    assert ran.returncode != 0
    assert ran.stderr.strip().splitlines()[-1].startswith(line), ran.stderr
