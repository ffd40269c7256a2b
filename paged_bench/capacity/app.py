"""``python -m paged_bench.plan``: read the plan, prune, search, report (see the package's docstring).

A bad plan is one line naming its key and a non-zero exit, before anything is simulated; a plan
no candidate wins still writes its table, plot and ``plan.json`` (and logs them), then says in
one line how close the best came, and exits 1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from paged_bench.capacity import command, output, trial
from paged_bench.capacity.launch import TrialJob, TrialLauncher, run_config, trial_key
from paged_bench.capacity.planner import Entry, PlanResult, run_plan, unmet_line
from paged_bench.capacity.search import SearchSettings
from paged_bench.capacity.slo import Slo
from paged_bench.capacity.space import Candidate, candidates
from paged_bench.cli.hydra_errors import hydra_error
from paged_bench.errors import ConfigError, PagedBenchError, check_int
from paged_bench.run.bench import build, build_engine

# the keys under which the engine refuses a shape that does not fit its GPUs (weights, or a KV
# pool too small for one longest sequence): a pruned candidate, where any other refusal is the plan's error
SIZING_KEYS = ("max_model_len", "num_blocks", "backend.tensor_parallel_size", "backend.gpu_memory_utilization")


def _short(value: float) -> float:
    return float(f"{value:.6g}")


def scale_override(workload: dict[str, Any], scale: float) -> str:
    """The override that runs the workload at ``scale`` times its own rate."""
    if "time_scale" in workload:
        return f"workload.time_scale={_short((workload.get('time_scale') or 1.0) / scale)}"
    if workload.get("rate") is not None:
        return f"workload.rate={_short(workload['rate'] * scale)}"
    raise ConfigError("workload", workload.get("name"), "a workload with a rate (workload.rate) or a trace "
                      "(workload.time_scale) for the plan to scale")  # fmt: skip


class Plan:
    """A plan's config read and checked, its launcher, and what it has measured."""

    def __init__(self, cfg: DictConfig) -> None:
        plan = OmegaConf.to_container(cfg.plan, resolve=True)
        self.slo = Slo.from_config(plan.get("slo"))
        self.settings = SearchSettings(target=plan.get("target_scale"), **(plan.get("search") or {}))
        self.candidates = candidates(plan.get("space") or {}, plan.get("prices") or {})
        self.wave = check_int("plan.wave", plan.get("wave"))
        self.run = run_config(cfg)
        self.scale_override(1.0)  # a workload it cannot scale: refused now
        self.trials_dir = Path(plan.get("trials_dir") or "runs/plan/trials").resolve()
        self.launcher = TrialLauncher(cfg, self.trials_dir)
        hc = HydraConfig.get()
        # the user's overrides of the run (not of the plan, Hydra or tracking, which change no simulation)
        self.base = [
            o
            for o in hc.overrides.task
            if not o.lstrip("+~").startswith(("plan.", "plan/", "hydra", "tracking.", "experiment_name"))
        ]
        # the simulator's cost model, on every simulation's command line: one override switches it
        self.extra = [f"backend.cost_model={plan.get('cost_model')}"]
        self.folder = Path(hc.runtime.output_dir)
        self.base_rate = 0.0

    def scale_override(self, scale: float) -> str:
        return scale_override(self.run["workload"], scale)

    def refuses(self, candidate: Candidate) -> str | None:
        """Why the engine will not build this candidate's replica (None: it builds); kept in the
        trials' folder, as a simulation is, so that a rerun composes and builds nothing."""
        folder = self.trials_dir / trial_key(self.run, ["sizing", *self.extra, *candidate.engine_overrides()], self.slo)
        record = trial.read(folder)
        if record is None:
            record = self._sizing(candidate)
            trial.write(folder, record)
        if record["refused"] is None and not self.base_rate:
            self.base_rate = record["base_rate"]
        return record["refused"]

    def _sizing(self, candidate: Candidate) -> dict[str, Any]:
        cfg = run_config(self.launcher.compose([*self.extra, *candidate.engine_overrides()]))
        try:
            build_engine(cfg)
        except ConfigError as e:
            if e.key not in SIZING_KEYS:
                raise
            kind = "weights do not fit" if "weights" in str(e) else "KV pool cannot hold one longest request"
            return {"refused": f"{kind}: {e}", "base_rate": None}
        if not self.base_rate:  # the workload's own request rate, for QPS per dollar
            bench = build(cfg)
            bench.backend.close()
            times = sorted(r.arrival_time for r in bench.requests)
            span = times[-1] - times[0] if len(times) > 1 else 0.0
            self.base_rate = (len(times) - 1) / span if span > 0 else 0.0
        return {"refused": None, "base_rate": self.base_rate}

    def command(self, entry: Entry) -> str:
        """``entry`` at the target load as a plain ``python -m paged_bench`` command line."""
        overrides = [*self.extra, *entry.candidate.overrides(), self.scale_override(self.settings.target)]
        cfg = self.launcher.compose(overrides)
        choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
        return command.command_line(self.launcher.loader, run_config(cfg), choices)

    def runner(self, steps: list[tuple[Entry, float]]) -> list[dict[str, Any]]:
        """Each (candidate, scale): read back from its folder, or launched with the others."""
        out: list[dict[str, Any] | None] = []
        jobs = []
        for entry, scale in steps:
            overrides = [*self.extra, *entry.candidate.overrides(), self.scale_override(scale)]
            key = trial_key(self.run, overrides, self.slo)
            found = trial.read(self.trials_dir / key)
            out.append({**found, "reused": True} if found is not None else None)
            if found is None:
                jobs.append(TrialJob(key, overrides, scale))
        launched = iter(self.launcher.launch(jobs))
        return [record if record is not None else next(launched) for record in out]


def _progress(entries: list[Entry]) -> None:
    for e in entries:
        t = e.trials[-1]
        how = "reused" if t.get("reused") else f"{t.get('cpu_s', 0):.1f} CPU-s"
        verdict = (
            "meets" if t["passed"] else f"fails: {t['error']}" if t.get("error") else f"misses {', '.join(t['missed'])}"
        )
        print(f"  {e.candidate.label}: {t['scale']:g}x {verdict} ({how})", flush=True)


def report(plan: Plan, result: PlanResult, cfg: DictConfig) -> None:
    names = [lim.name for lim in plan.slo.limits]
    counts = result.pruned_counts()
    simulated = sum(e.measured for e in result.entries)
    print(f"\n{len(result.entries)} candidates: {simulated} simulated, {sum(counts.values())} pruned"
          + "".join(f"\n  {n} {why}" for why, n in counts.most_common()))  # fmt: skip
    per = result.trial_cpu_s / result.num_trials if result.num_trials else 0.0
    print(f"{result.num_trials} simulations run ({result.trial_cpu_s:.1f} CPU-s, {per:.2f} each), "
          f"{result.num_reused} reused from {plan.trials_dir}; {result.wall_s:.1f} s wall\n")  # fmt: skip
    print(output.table(result, names, plan.base_rate))
    command = None
    if result.winner is not None:
        command = plan.command(result.winner)
        cost = result.winner.candidate.usd_per_hour
        # the check a reader makes: the winner rerun meets the SLO, the next-cheaper candidate does not
        cheaper = [e for e in result.entries if e.measured and e.candidate.usd_per_hour <= cost and e is not result.winner
                   and not e.search.meets(result.target)]  # fmt: skip
        runner_up = max(cheaper, key=lambda e: e.candidate.usd_per_hour, default=None)
        w = result.winner
        print(
            f"\nwinner: {w.candidate.label}, {w.candidate.num_gpus} GPUs at ${w.candidate.usd_per_hour:,.2f}/h, "
            f"serves {w.search.capacity:g}x (target {result.target:g}x) under {plan.slo.describe()}\n  {command}"
        )
    plot = output.plot(result, plan.folder / "pareto.png", f"{plan.slo.describe()}; target {result.target:g}x")
    record = output.plan_record(result, plan.base_rate, command)
    if result.winner is not None and runner_up is not None:
        record["next_cheaper"] = {"label": runner_up.candidate.label, "usd_per_hour": runner_up.candidate.usd_per_hour,
                                  "command": plan.command(runner_up)}  # fmt: skip
        print(
            f"next cheaper: {runner_up.candidate.label} at ${runner_up.candidate.usd_per_hour:,.2f}/h, does not "
            f"meet the target (capacity < {runner_up.search.upper:g}x)\n  {record['next_cheaper']['command']}"
        )
    path = output.write(plan.folder, record)
    print(f"-> {path}, {plot}")
    tracking = cfg.get("tracking") or {}
    if tracking.get("enabled"):
        params = {"slo": plan.slo.describe(), "target_scale": result.target, "candidates": len(result.entries),
                  "base": " ".join(plan.base)}  # fmt: skip
        run_id = output.track(tracking.get("uri"), cfg.get("experiment_name") or "paged_bench", result,
                              plan.base_rate, [path, plot], params)  # fmt: skip
        print(f"MLflow: parent run {run_id} ({simulated} candidate runs)")
    if result.winner is None:
        raise PagedBenchError(unmet_line(result, plan.slo.describe(), names))


@hydra.main(version_base="1.3", config_path="pkg://paged_bench.conf", config_name="plan")
def main(cfg: DictConfig) -> None:
    plan = Plan(cfg)
    print(f"plan: {len(plan.candidates)} candidates, target {plan.settings.target:g}x under {plan.slo.describe()}; "
          f"capacity to {plan.settings.precision:.0%} (bisection on the rate scale)", flush=True)  # fmt: skip
    result = run_plan(plan.candidates, plan.settings, plan.runner, plan.refuses, plan.wave, _progress)
    report(plan, result, cfg)


def cli() -> None:
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except PagedBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (HydraException, ValueError, TypeError) as e:
        line = hydra_error(e)
        if full_error or line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
