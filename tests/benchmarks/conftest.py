"""``make bench`` prints each benchmark's figures (``extra_info``: us per sequence-step and the
ratio to nano-vllm's, steps per second) under pytest-benchmark's timing table."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = getattr(config, "_benchmarksession", None)
    benchmarks = [b for b in getattr(session, "benchmarks", []) if b.extra_info]
    if not benchmarks:
        return
    terminalreporter.section("figures (extra_info)")
    for bench in benchmarks:
        figures = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in bench.extra_info.items())
        terminalreporter.write_line(f"{bench.name}: {figures}")
