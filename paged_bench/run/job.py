"""One benchmark job, start to finish: config -> engine -> run -> files on disk.

Shared by the command line and anything else that runs jobs (tests, sweeps, the server's
offline mode). Whatever happens during the run, what was measured is written out.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from paged_bench.cluster.cluster_job import run_cluster_job
from paged_bench.cluster.spec import cluster_spec, unused_router_note
from paged_bench.core.engine import EngineResult
from paged_bench.errors import check
from paged_bench.results.metrics import summarize
from paged_bench.results.records import RequestRecords
from paged_bench.results.run_files import write_run, write_steps
from paged_bench.run.bench import Bench, build
from paged_bench.run.frontend import receive_through, send_through
from paged_bench.run.outcome import JobOutcome, ProgressCallback, capacity_figures, run_info, step_callback
from paged_bench.run.output_timing import deliver_as_vllm060


def run_job(cfg: Mapping[str, Any], run_dir: Path, on_progress: ProgressCallback | None = None,
            options: Mapping[str, str] | None = None,
            shield: Callable[[], AbstractContextManager[Any]] = nullcontext) -> JobOutcome:  # fmt: skip
    """Build and run one job from a resolved config; raises ConfigError/PluginError before
    anything runs, never after (a run that stops early is reported in the outcome).
    ``options``: the config option picked per group (Hydra's choices: ``workload=seed``), which
    ``run_info.json`` records beside the plugin each one selected (``poisson``). What the run
    measured is summarized and written inside ``shield()`` (the CLI's defers a Ctrl-C)."""
    if (spec := cluster_spec(cfg)) is not None:  # more than one replica: paged_bench.cluster
        return run_cluster_job(cfg, run_dir, spec, on_progress, options, shield)
    if (note := unused_router_note(cfg)) is not None:
        print(note, file=sys.stderr)
    bench = build(cfg)
    on_step = step_callback(on_progress, len(bench.requests))
    target = bench.config.run.target
    remote = None
    try:
        if target == "engine":
            result = run_in_process(bench, on_step)
        else:  # the same requests, sent to an OpenAI-compatible server
            from paged_bench.loadgen import run_target  # HTTP client code only for remote runs

            bench.choices["target"] = target
            if target == "openai":  # the server's own scheduler, pool and model served it, not this config's
                for kind in ("scheduler", "allocator", "backend"):
                    del bench.choices[kind]
            remote = run_target(cfg, bench, run_dir, on_step)
            result = remote.result
    finally:
        bench.backend.close()
    with shield():
        return _write_outcome(run_dir, bench, result, remote, target, options)


def _write_outcome(run_dir: Path, bench: Bench, result: EngineResult, remote: Any, target: str,
                   options: Mapping[str, str] | None) -> JobOutcome:  # fmt: skip
    try:
        records = RequestRecords.from_requests(result.requests) if remote is None else remote.records
        summary = summarize(result, bench.config.run.slo, records)
    except Exception:
        # a figure failed to compute (a bug): what the engine measured, step by step, still reaches
        # the disk before the error is reported
        write_steps(run_dir, result.steps)
        raise
    summary.update(capacity_figures(result.layout, bench.backend.num_devices, summary.get("output_throughput")))
    if remote is not None:
        summary.update(remote.summary)  # engine-only figures null (the pool is the server's), server-side TTFT added
    outcome = JobOutcome(run_dir, summary, result, bench.choices, [], records)
    target_info = target if remote is None else {"name": target, "base_url": remote.target.base_url}
    info = run_info(outcome, target_info, bench.kv_budget, options)
    if remote is None:  # what computed it, as resolved (threads: null in the config is the job's share of the cores)
        info["compute"] = {"devices": bench.backend.num_devices, "threads_per_device": bench.backend.threads}
    outcome.files = write_run(run_dir, result, summary, info, records)
    return outcome


def run_in_process(bench: Bench, on_step: Callable[[EngineResult], object] | None) -> EngineResult:
    """The engine runs the bench's requests, through its priced front end where one is set
    (``paged_bench.run.frontend``): what ``target=engine`` runs, and each capacity plan's trial."""
    frontend = bench.config.run.frontend
    sent = send_through(bench.requests, frontend)
    window_log = bench.engine.scheduler.window_log = [] if frontend.output_timing == "vllm060" else None
    if frontend.stream_ms:  # the API server in the engine's process: serial with its steps
        check(bench.engine.clock.kind == "virtual", "frontend.stream_ms", frontend.stream_ms,
              "0 on a wall clock (it prices the server's work into each step's virtual time; clock=virtual)")  # fmt: skip
        bench.engine.stream_s = frontend.stream_ms / 1e3
    result = bench.engine.run(bench.requests, on_step, bench.max_concurrency)
    if window_log is not None:  # outputs reach the client as vLLM 0.6.0's server hands them over
        deliver_as_vllm060(result, window_log)
    if frontend.priced:
        receive_through(result, sent, frontend)
    return result
