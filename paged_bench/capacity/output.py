"""What a plan leaves: the ranked table, the Pareto plot of cost against capacity, the
winner's command line, ``plan.json``, and an MLflow parent run with one child per candidate.

Costs: a deployment's $/hour is its GPUs times their price; at the target load it serves
``target x`` the workload's request rate, so QPS per dollar is that rate over $/hour and the
cost of a million output tokens is $/hour over the output tokens it generates in an hour.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paged_bench.capacity.planner import Entry, PlanResult, ranked
from paged_bench.tracking import store
from paged_bench.tracking.runs import KIND_TAG, PARENT_TAG, common_tags

TABLE_ROWS = 25


def at_target(e: Entry, target: float) -> Mapping[str, Any]:
    """The trial at the target scale (its SLO figures and throughput), or {}."""
    return next((t for t in e.trials if t["scale"] == target), {})


def economics(e: Entry, target: float, base_rate: float) -> dict[str, float | None]:
    """QPS per $/hour at the load it serves under the SLO (the target, or its capacity if lower),
    and $ per million output tokens at the target load (where it was measured whole)."""
    summary = at_target(e, target).get("summary") or {}
    usd = e.candidate.usd_per_hour
    tokens = summary.get("output_throughput")
    served = min(target, e.search.capacity)
    return {"usd_per_hour": usd, "qps_per_usd_hour": base_rate * served / usd if base_rate and served else None,
            "usd_per_million_output_tokens": usd / (tokens * 3600) * 1e6 if tokens else None}  # fmt: skip


def _capacity_text(e: Entry) -> str:
    s = e.search
    if s.lo is None:
        return f"< {s.upper:g}"
    return f"{s.lo:g}-{s.upper:g}" if math.isfinite(s.upper) else f">= {s.lo:g}"


def table(result: PlanResult, names: Sequence[str], base_rate: float) -> str:
    rows = ranked(result)
    head = f"{'#':>3}  {'deployment':<52} {'GPUs':>4} {'$/h':>8} {'capacity x':>12} {'meets':>5}  " + "  ".join(
        f"{n:>12}" for n in names) + f"  {'QPS/$h':>7} {'$/Mtok':>7}"  # fmt: skip
    lines = [head]
    for i, e in enumerate(rows[:TABLE_ROWS], 1):
        figures = at_target(e, result.target).get("figures") or {}
        econ = economics(e, result.target, base_rate)
        cells = "  ".join(f"{figures[n]:>12,.1f}" if figures.get(n) is not None else f"{'stopped':>12}" for n in names)
        meets = "yes" if e.search.meets(result.target) else "no"
        qps = f"{econ['qps_per_usd_hour']:>7.3f}" if econ["qps_per_usd_hour"] else f"{'':>7}"
        mtok = f"{econ['usd_per_million_output_tokens']:>7.2f}" if econ["usd_per_million_output_tokens"] else f"{'':>7}"
        lines.append(f"{i:>3}  {e.candidate.label:<52} {e.candidate.num_gpus:>4} {e.candidate.usd_per_hour:>8,.2f} "
                     f"{_capacity_text(e):>12} {meets:>5}  {cells}  {qps} {mtok}")  # fmt: skip
    if len(rows) > TABLE_ROWS:
        lines.append(f"     ... {len(rows) - TABLE_ROWS} more in plan.json")
    return "\n".join(lines)


def frontier(entries: Sequence[Entry]) -> list[Entry]:
    """The measured candidates no other beats on both cost and capacity, cheapest first."""
    out: list[Entry] = []
    for e in sorted(entries, key=lambda e: (e.candidate.usd_per_hour, -e.search.capacity)):
        if e.search.capacity > 0 and (not out or e.search.capacity > out[-1].search.capacity):
            out.append(e)
    return out


def plot(result: PlanResult, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [e for e in result.entries if e.measured]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for meets, colour, label in ((True, "tab:green", "meets the target"), (False, "tab:grey", "does not")):
        pts = [e for e in measured if bool(e.search.meets(result.target)) == meets]
        ax.scatter([e.candidate.usd_per_hour for e in pts], [e.search.capacity for e in pts], c=colour, s=18,
                   label=label, alpha=0.8)  # fmt: skip
    front = frontier(measured)
    ax.step([e.candidate.usd_per_hour for e in front], [e.search.capacity for e in front], where="post",
            c="tab:blue", label="SLO frontier (Pareto)")  # fmt: skip
    ax.axhline(result.target, c="tab:red", ls="--", lw=1, label=f"target {result.target:g}x")
    if result.winner is not None:
        w = result.winner
        ax.scatter([w.candidate.usd_per_hour], [w.search.capacity], marker="*", s=160, c="tab:orange",
                   label=f"winner: {w.candidate.label}", zorder=5)  # fmt: skip
    ax.set_xlabel("cost ($/hour)")
    ax.set_ylabel("capacity under the SLO (x the workload's rate)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plan_record(result: PlanResult, base_rate: float, command: str | None) -> dict[str, Any]:
    def entry(e: Entry) -> dict[str, Any]:
        return {**e.candidate.params(), "label": e.candidate.label, "overrides": e.candidate.overrides(),
                "capacity": e.search.capacity, "capacity_below": None if math.isinf(e.search.upper) else e.search.upper,
                "meets_target": e.search.meets(result.target), "pruned": e.pruned,
                "trials": [{k: t.get(k) for k in ("scale", "passed", "missed", "figures", "cpu_s", "stopped_early")}
                           for t in e.trials],
                **economics(e, result.target, base_rate)}  # fmt: skip

    return {"target_scale": result.target, "base_rate": base_rate, "winner": entry(result.winner) if result.winner
            else None, "command": command, "num_trials": result.num_trials, "num_reused": result.num_reused,
            "trial_cpu_s": result.trial_cpu_s, "pruned": dict(result.pruned_counts()),
            "candidates": [entry(e) for e in result.entries]}  # fmt: skip


def write(folder: Path, record: Mapping[str, Any]) -> Path:
    path = folder / "plan.json"
    path.write_text(json.dumps(record, indent=1, default=str))
    return path


def track(uri: str | None, experiment: str, result: PlanResult, base_rate: float, artifacts: list[Path],
          params: Mapping[str, Any]) -> str:  # fmt: skip
    """One parent run for the plan, one child per simulated candidate; the parent's id."""
    from mlflow.entities import Metric, Param, RunTag

    resolved = store.resolve_uri(uri)
    client = store.client(resolved)
    exp = store.experiment_id(client, experiment, resolved)
    parent = client.create_run(exp, tags={**common_tags(experiment), KIND_TAG: "plan"}, run_name="plan").info.run_id
    client.log_batch(parent, params=[Param(k, str(v)[:500]) for k, v in params.items()])
    for e in (e for e in result.entries if e.measured):
        tags = {**common_tags(experiment), KIND_TAG: "plan_candidate", PARENT_TAG: parent,
                "meets_target": str(bool(e.search.meets(result.target))).lower(), "pruned": e.pruned or ""}  # fmt: skip
        run = client.create_run(exp, tags=tags, run_name=e.candidate.label).info.run_id
        figures = at_target(e, result.target).get("figures") or {}
        values = {"capacity": e.search.capacity, "num_trials": len(e.trials), **figures,
                  **economics(e, result.target, base_rate)}  # fmt: skip
        metrics = [Metric(k, float(v), 0, 0) for k, v in values.items() if isinstance(v, (int, float))]
        client.log_batch(run, metrics=metrics, params=[Param(k, str(v)) for k, v in e.candidate.params().items()])
        client.set_terminated(run, "FINISHED")
    for path in artifacts:
        client.log_artifact(parent, str(path))
    if result.winner is not None:
        client.log_batch(parent, metrics=[Metric("winner_usd_per_hour", result.winner.candidate.usd_per_hour, 0, 0),
                                          Metric("winner_capacity", result.winner.search.capacity, 0, 0)],
                         tags=[RunTag("winner", result.winner.candidate.label)])  # fmt: skip
    client.set_terminated(parent, "FINISHED")
    return parent
