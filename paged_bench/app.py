"""One benchmark job, start to finish: config -> engine -> run -> files on disk.

Shared by the command line and anything else that runs jobs (tests, sweeps, the server's
offline mode). Whatever happens during the run, what was measured is written out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paged_bench.build import build
from paged_bench.engine import Engine, EngineResult
from paged_bench.metrics import summarize
from paged_bench.outputs import write_run


@dataclass
class JobOutcome:
    run_dir: Path
    summary: dict[str, Any]
    result: EngineResult
    choices: dict[str, str]
    files: list[Path]

    @property
    def status(self) -> str:
        if self.result.interrupted:
            return "interrupted"
        return "failed" if self.result.error or self.result.leaks else "finished"

    @property
    def error(self) -> str | None:
        if self.result.leaks:
            return "the engine leaked KV state: " + "; ".join(self.result.leaks)
        return self.result.error


def run_job(
    cfg: Mapping[str, Any], run_dir: Path, on_step: Callable[[Engine], None] | None = None
) -> JobOutcome:
    """Build and run one job from a resolved config; raises ConfigError/PluginError before
    anything runs, never after (a run that stops early is reported in the outcome)."""
    bench = build(cfg)
    try:
        result = bench.engine.run(bench.requests, on_step)
    finally:
        bench.backend.close()
    summary = summarize(result, cfg.get("slo"))
    outcome = JobOutcome(run_dir, summary, result, bench.choices, [])
    info = {
        "status": outcome.status,
        "error": outcome.error,
        "choices": bench.choices,
        "kv_layout": {
            "num_blocks": result.layout.num_blocks,
            "block_size": result.layout.block_size,
            "num_cpu_blocks": result.layout.num_cpu_blocks,
        },
        "num_requests": len(result.requests),
        "num_steps": len(result.steps),
    }
    outcome.files = write_run(run_dir, result, summary, info)
    return outcome
