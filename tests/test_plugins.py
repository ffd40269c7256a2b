"""Plugins through entry points: the listing command, the example SJF package installed into
the environment and run through the CLI in a sweep beside the built-ins, a plugin package's
config option, and broken plugins reported by name and package without breaking the others."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin_support import fake_distribution
from tests.tracking_support import call_cli, run_cli

REPO = Path(__file__).resolve().parents[1]

BROKEN = {
    "paged_bench.schedulers": {
        "exploding": "broken_plugins_missing_module:Whatever",  # import error
        "notasched": "broken_plugins:NotAScheduler",  # wrong base class
    },
    "paged_bench.conf": {"broken": "broken_plugins_no_conf_here"},  # config options that cannot be read
}
BROKEN_MODULE = "class NotAScheduler:\n    pass\n"


@pytest.fixture
def broken_site(tmp_path):
    return str(fake_distribution(tmp_path / "site", "broken-plugins", BROKEN, {"broken_plugins": BROKEN_MODULE}))


def test_the_listing_shows_every_kind_with_its_package(tmp_path):
    proc = call_cli(tmp_path, "--plugins")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for kind in ("workload", "scheduler", "allocator", "backend"):
        assert f"\n{kind} (paged_bench.{kind}s)" in out
    line = next(l for l in out.splitlines() if l.strip().startswith("continuous "))
    assert "paged_bench.core.scheduler.continuous:ContinuousScheduler" in line and line.rstrip().endswith(
        "from paged-bench"
    )


def test_a_broken_plugin_is_named_with_its_package_and_the_others_still_work(tmp_path, broken_site):
    listing = run_cli(tmp_path, "--plugins", PYTHONPATH=broken_site)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    exploding = next(l for l in lines if l.strip().startswith("exploding "))
    assert "from broken-plugins" in exploding and "BROKEN" in exploding and "ModuleNotFoundError" in exploding
    notasched = next(l for l in lines if l.strip().startswith("notasched "))
    assert "BROKEN" in notasched and "not a subclass of paged_bench.core.scheduler.base.Scheduler" in notasched
    assert "BROKEN" not in next(l for l in lines if l.strip().startswith("continuous "))
    assert "config options of plugin 'broken'" in listing.stdout and "broken-plugins" in listing.stdout

    for name, why in (("exploding", "failed to load: ModuleNotFoundError"), ("notasched", "is not a subclass")):
        proc = run_cli(tmp_path, f"scheduler.name={name}", "tracking.enabled=false", PYTHONPATH=broken_site)
        assert proc.returncode == 2
        (line,) = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
        assert f"scheduler plugin {name!r}" in line and "package broken-plugins" in line and why in line
        assert "Traceback" not in proc.stderr

    ok = run_cli(tmp_path, "scheduler=static", "tracking.enabled=false", PYTHONPATH=broken_site)
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr.count("warning: config options of plugin 'broken'") == 1  # said once, then ignored


SHIPPED_OPTION = """# a plugin package's own config option
name: continuous
max_batch: 3
max_num_batched_tokens: ${max_num_batched_tokens}
chunked_prefill: true
"""


def test_a_plugin_package_ships_its_config_option(tmp_path):
    site = fake_distribution(
        tmp_path / "site", "option-plugins", {"paged_bench.conf": {"opts": "option_plugins_conf"}}, {}
    )
    conf = site / "option_plugins_conf"
    (conf / "scheduler").mkdir(parents=True)
    (conf / "__init__.py").write_text("")
    (conf / "scheduler" / "narrow.yaml").write_text(SHIPPED_OPTION)
    proc = run_cli(tmp_path, "scheduler=narrow", "tracking.enabled=false", PYTHONPATH=str(site))
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = [p.parent for p in tmp_path.glob("runs/20*/*/config.yaml")]
    assert "max_batch: 3" in (run_dir / "config.yaml").read_text()
    steps = (run_dir / "steps.csv").read_text().splitlines()[1:]
    assert max(int(row.split(",")[3]) for row in steps) == 3  # batch_size never above the option's max_batch
    help_text = run_cli(tmp_path, "--help", PYTHONPATH=str(site)).stdout
    assert "scheduler: continuous, narrow, preemptive, static" in help_text


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


@pytest.mark.slow
def test_the_sjf_example_installs_and_runs_in_a_sweep_beside_the_built_ins(tmp_path):
    source = tmp_path / "sjf"
    shutil.copytree(
        REPO / "plugins" / "sjf", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    # a normal (non-editable) install; without build isolation it needs no download when setuptools is at hand
    installed = _pip("install", "--no-deps", "--no-build-isolation", str(source))
    if installed.returncode != 0:
        installed = _pip("install", "--no-deps", str(source))
    try:
        assert installed.returncode == 0, installed.stderr
        listing = run_cli(tmp_path, "--plugins")
        sjf = next(l for l in listing.stdout.splitlines() if l.strip().startswith("sjf "))
        assert "paged_bench_sjf.scheduler:SJFScheduler" in sjf and sjf.rstrip().endswith("from paged-bench-sjf")

        proc = run_cli(tmp_path, "-m", "scheduler=continuous,sjf,static", "max_batch=4", "tracking.enabled=false")
        assert proc.returncode == 0, proc.stderr
        (sweep_dir,) = [p.parent for p in tmp_path.glob("runs/multirun/*/*/sweep.json")]
        summary = {job: json.loads((sweep_dir / str(job) / "summary.json").read_text()) for job in range(3)}
        assert all(s["completed"] == 48 and s["failed"] == 0 for s in summary.values())
        assert "name: sjf" in (sweep_dir / "1" / "config.yaml").read_text()
        packages = json.loads((sweep_dir / "1" / "run_info.json").read_text())["plugin_packages"]
        assert packages["scheduler"] == "paged-bench-sjf==0.1.0" and packages["workload"].startswith("paged-bench==")
        # shortest job first: short requests stop queueing behind long ones
        assert summary[1]["median_ttft_ms"] < summary[0]["median_ttft_ms"]
        assert "| sjf " in proc.stdout  # in the sweep's summary table beside the built-ins
    finally:
        removed = _pip("uninstall", "-y", "paged-bench-sjf")
    assert removed.returncode == 0, removed.stderr
    assert "sjf " not in run_cli(tmp_path, "--plugins").stdout
