"""The compiled engine core (``paged_bench.native.guard``): built wherever the machine can build it,
the same results as its source to the byte, and never run stale."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paged_bench.native import compile as native_build
from paged_bench.native import guard as native
from tests.tracking_support import call_cli

# the paths through the compiled code: prefill chunks, decodes, preemption by swap and by
# recompute, prefix hits (deferred and eager hashing), a cluster's replicas
RUNS = {
    "seed": ("workload=seed",),
    "swap": ("scheduler=preemptive", "scheduler.mode=swap", "allocator.swap_blocks=8", "num_blocks=40",
             "workload=poisson", "workload.num_requests=120", "workload.rate=80", "max_num_batched_tokens=256",
             "workload.shared_prefix.num_prefixes=3", "workload.shared_prefix.length=40"),
    "recompute": ("scheduler=preemptive", "num_blocks=36", "workload=poisson", "workload.num_requests=120",
                  "workload.rate=80", "workload.shared_prefix.num_prefixes=2", "workload.shared_prefix.length=48",
                  "allocator.defer_unshared=false"),
    "cluster": ("cluster.replicas=2", "router=least_kv", "workload=poisson", "workload.num_requests=80"),
}  # fmt: skip
OUTPUTS = ("requests.csv", "steps.csv", "summary.json")


def run(overrides: tuple[str, ...], run_dir: Path, interpreted: bool) -> str:
    """The command's run into ``run_dir``, with the compiled core or interpreted: which it was.
    Compiled, in this process where its core is (call_cli: no interpreter to start)."""
    if not interpreted and native.is_compiled("paged_bench.core.engine"):
        ran = call_cli(run_dir.parent, *overrides, f"hydra.run.dir={run_dir}", "tracking.enabled=false")
        assert ran.returncode == 0, ran.stderr[-2000:]
        return "compiled"
    env = {**os.environ, native.INTERPRETED_ENV: "1" if interpreted else "0"}
    code = ("import sys, paged_bench.core.engine, paged_bench.native.guard as n, runpy; sys.argv = ['paged_bench', *sys.argv[1:]]; "
            "print('compiled' if n.is_compiled('paged_bench.core.engine') else 'interpreted', file=sys.stderr); "
            "runpy.run_module('paged_bench', run_name='__main__')")  # fmt: skip
    args = [sys.executable, "-c", code, *overrides, f"hydra.run.dir={run_dir}", "tracking.enabled=false"]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr.splitlines()[0]


@pytest.mark.skipif(native_build.missing_tools() is not None, reason="this machine cannot compile the core")
def test_the_core_is_compiled_where_it_can_be():
    # make install compiles it: a build that failed quietly would leave every figure interpreted
    assert native_build.up_to_date(), f"stale or missing: run make install ({native.stale()})"
    if os.environ.get(native.INTERPRETED_ENV, "") in ("", "0"):
        for module in native.MODULES:
            importlib.import_module(module)
            assert native.is_compiled(module), module


@pytest.mark.parametrize("name", RUNS)
def test_compiled_and_interpreted_write_the_same_files(name, tmp_path):
    if native.extension("paged_bench.core.engine") is None:
        pytest.skip("no compiled core here")
    assert run(RUNS[name], tmp_path / "compiled", interpreted=False) == "compiled"
    assert run(RUNS[name], tmp_path / "interpreted", interpreted=True) == "interpreted"
    for file in OUTPUTS:
        compiled, interpreted = (tmp_path / kind / file for kind in ("compiled", "interpreted"))
        assert compiled.read_bytes() == interpreted.read_bytes(), file
    if name in ("swap", "recompute"):  # the run reached what it is here for
        assert '"num_preemptions": 0,' not in (tmp_path / "compiled" / "summary.json").read_text()


def test_a_stale_extension_is_found(tmp_path, monkeypatch):
    (tmp_path / "core").mkdir()
    for name in ("engine", "arrivals"):
        (tmp_path / "core" / f"{name}.py").write_text("")
    monkeypatch.setattr(native, "PACKAGE", tmp_path)
    monkeypatch.setattr(native, "MODULES", ("paged_bench.core.engine",))
    assert native.stale() == []  # never compiled
    suffix = native.importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in ("core/engine", "_native__mypyc"):
        (tmp_path / f"{name}{suffix}").write_bytes(b"")
    assert native.stale() == []
    monkeypatch.setattr(native, "MODULES", ("paged_bench.core.engine", "paged_bench.core.arrivals"))
    assert native.stale() == ["paged_bench.core.arrivals"]  # added to the set since the build
    monkeypatch.setattr(native, "MODULES", ("paged_bench.core.engine",))
    later = time.time() + 10
    os.utime(tmp_path / "core" / "engine.py", (later, later))  # edited after it was compiled
    assert native.stale() == ["paged_bench.core.engine"]
    (tmp_path / f"_native__mypyc{suffix}").unlink()
    os.utime(tmp_path / "core" / "engine.py", (0, 0))
    assert native.stale() == ["paged_bench.core.engine"]  # the shims without the code they load


def test_a_stale_core_runs_from_source_and_says_so():
    finder = native._SourceFinder(["paged_bench.core.engine"])
    with pytest.warns(UserWarning, match=r"paged_bench/core/engine.py: the compiled engine core is older than this source.*make install"):
        spec = finder.find_spec("paged_bench.core.engine")
    assert spec is not None and spec.origin == str(native.source("paged_bench.core.engine"))
    assert finder.find_spec("paged_bench.results.metrics") is None  # not compiled: the usual finders find it
    assert finder.find_spec("paged_bench.core.request").origin.endswith("request.py")  # warned once, for all


def test_asking_for_the_interpreted_core_gets_it():
    env = {**os.environ, native.INTERPRETED_ENV: "1"}
    code = "import paged_bench.core.engine as e, paged_bench.native.guard as n; print(e.__file__, n.is_compiled('paged_bench.core.engine'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == [str(native.source("paged_bench.core.engine")), "False"]
