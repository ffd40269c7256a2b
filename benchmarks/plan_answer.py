"""The answer of a capacity plan as the Markdown docs/capacity.md quotes: the winner and its
command line, the cheapest candidates that meet the target and the nearest that do not, what
was pruned and why, the simulations' cost, and whether a prefill/decode split paid.

    python benchmarks/plan_answer.py runs/plan/DATE/TIME/plan.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROWS = 8


def _row(c: dict[str, Any], names: list[str]) -> str:
    trial = next((t for t in c["trials"] if t["scale"] == RECORD["target_scale"]), {})
    figures = trial.get("figures") or {}
    cells = " | ".join(f"{figures[n]:,.0f}" if figures.get(n) is not None else "stopped" for n in names)
    below = c["capacity_below"]
    capacity = f"{c['capacity']:g}-{below:g}" if c["capacity"] and below else (f">= {c['capacity']:g}" if c["capacity"]
                                                                              else f"< {below:g}")  # fmt: skip
    return (f"| {c['label']} | {c['num_gpus']} | {c['usd_per_hour']:,.2f} | {capacity} | "
            f"{'yes' if c['meets_target'] else 'no'} | {cells} |")  # fmt: skip


def answer(record: dict[str, Any]) -> str:
    cands = [c for c in record["candidates"] if c["trials"]]
    names = sorted({n for c in cands for t in c["trials"] for n in t["figures"]})
    meets = sorted((c for c in cands if c["meets_target"]), key=lambda c: c["usd_per_hour"])
    misses = sorted((c for c in cands if not c["meets_target"]), key=lambda c: -c["usd_per_hour"])
    head = f"| deployment | GPUs | $/h | capacity (x) | meets {record['target_scale']:g}x | " + " | ".join(
        f"{n} at target" for n in names) + " |\n|" + "---|" * (5 + len(names))  # fmt: skip
    w = record["winner"]
    if w is None:
        best = max(cands, key=lambda c: c["capacity"], default=None)
        first = (
            f"**No candidate meets the target** (the best: {best['label']}, {best['capacity']:g}x).\n"
            if best
            else "**Nothing was simulated.**\n"
        )
        lines = [first, head]
        lines += [_row(c, names) for c in sorted(cands, key=lambda c: -c["capacity"])[:ROWS]]
        return "\n".join(lines)
    winner = (f"**Winner**: {w['label']} ({w['num_gpus']} GPUs, ${w['usd_per_hour']:,.2f}/h): "
              f"{w['qps_per_usd_hour']:.3f} QPS per $/h, ${w['usd_per_million_output_tokens'] or float('nan'):.2f} "
              f"per million output tokens.\n")  # fmt: skip
    title = "The cheapest that meet the target, and the costliest that do not:\n"
    lines = [winner, "```bash", record["command"], "```\n", title, head]
    lines += [_row(c, names) for c in meets[:ROWS]] + [_row(c, names) for c in misses[:ROWS]]
    splits = [c for c in cands if "P+" in c["split"]]
    best_split = min((c for c in splits if c["meets_target"]), key=lambda c: c["usd_per_hour"], default=None)
    if best_split is None:
        top = max(splits, key=lambda c: c["capacity"], default=None)
        if top is None:
            reach = ""
        elif top["capacity"]:
            reach = f" (the best measured, {top['label']}, serves {top['capacity']:g}x)"
        else:  # every search ended below its lowest scale
            reach = (
                f" (none of the {len(splits)} measured serves the search's lowest scale, {top['capacity_below']:g}x)"
            )
        verdict = "no prefill/decode split that costs no more than the winner meets the target" + reach
    else:
        verdict = f"the cheapest split that meets it, {best_split['label']}, costs ${best_split['usd_per_hour']:,.2f}/h"
    pruned = ", ".join(f"{n} {why}" for why, n in record["pruned"].items())
    per = record["trial_cpu_s"] / record["num_trials"] if record["num_trials"] else 0.0
    cost = (f"{len(record['candidates'])} candidates: {len(cands)} simulated, pruned: {pruned}. "
            f"{record['num_trials']} simulations, {record['trial_cpu_s']:.0f} CPU-s in all ({per:.2f} each).")  # fmt: skip
    lines += ["", f"Does a P/D split pay? {verdict}.", "", cost]
    return "\n".join(lines)


if __name__ == "__main__":
    RECORD = json.loads(Path(sys.argv[1]).read_text())
    print(answer(RECORD))
