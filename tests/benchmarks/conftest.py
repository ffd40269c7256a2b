"""``make bench`` prints each benchmark's figures (``extra_info``: us per sequence-step and the
ratio to nano-vllm's, steps per second) under pytest-benchmark's timing table, and which
engine core they timed: compiled (``make install``) or interpreted (``PAGED_BENCH_INTERPRETED=1``,
or a stale build)."""

from __future__ import annotations

from paged_bench.native import guard as native


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = getattr(config, "_benchmarksession", None)
    benchmarks = [b for b in getattr(session, "benchmarks", []) if b.extra_info]
    if not benchmarks:
        return
    terminalreporter.section("figures (extra_info)")
    core = "compiled" if native.is_compiled("paged_bench.core.scheduler.base") else "interpreted"
    terminalreporter.write_line(f"engine core: {core}")
    for bench in benchmarks:
        figures = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in bench.extra_info.items())
        terminalreporter.write_line(f"{bench.name}: {figures}")
