"""Mistakes a plugin author makes, each named where it is made (found by writing a router, a
workload and a backend package from the docs alone): an entry point in a group paged_bench does
not read (``paged_bench.router``), an option file without ``name:``, a conf folder installed
without its YAML, options that are positional-or-keyword arguments, and an entry-point name a
built-in already has."""

from __future__ import annotations

import pytest

from paged_bench.run import registry
from paged_bench.workloads.base import Workload
from tests.plugin_support import fake_distribution
from tests.test_plugin_catalog import _conf_package, _warnings
from tests.tracking_support import run_cli

ROUTER = """from paged_bench.routers.round_robin import RoundRobinRouter


class Fewest(RoundRobinRouter):
    name = "fewest"
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("site")
    fake_distribution(root, "slip-plugins", {"paged_bench.router": {"fewest": "slip_plugins:Fewest"},  # singular
                                             "paged_bench.conf": {"slip": "slip_conf"}},
                      {"slip_plugins": ROUTER})  # fmt: skip
    _conf_package(root, "slip_conf", {"router/fewest.yaml": "name: fewest\n", "router/noname.yaml": "seed: 1\n",
                                      "router/broken.yaml": "name: fewest\nseed: [1\n"})  # fmt: skip
    fake_distribution(root, "bare-plugins", {"paged_bench.conf": {"bare": "bare_conf"}}, {})
    _conf_package(root, "bare_conf", {})  # installed without its YAML (no package data)
    return str(root)


def test_each_mistake_is_one_warning_naming_the_file_and_what_to_do(tmp_path, site):
    proc = run_cli(tmp_path, "--plugins", PYTHONPATH=site)
    assert proc.returncode == 0, proc.stderr
    bare = ("warning: plugin package bare-plugins ships no option files in bare_conf/ (<group>/<option>.yaml): "
            "install them with the package, as package data")
    wrong_group = ("warning: plugin package slip-plugins ships slip_conf/router/fewest.yaml, whose name: fewest is "
                   "no installed router plugin: register it in entry-point group paged_bench.routers")
    unnamed = ("warning: plugin package slip-plugins ships slip_conf/router/noname.yaml, which sets no name: key: "
               "not registered; set name: to its router plugin's entry-point name")
    # a YAML error was "config options of plugin 'slip' (slip_conf) could not be loaded", no file
    # named, and every other file of the package was left out with it
    broken = "warning: plugin package slip-plugins ships slip_conf/router/broken.yaml, which could not be read: "
    found = sorted(_warnings(proc.stdout))
    assert [w for w in found if not w.startswith(broken)] == [bare, wrong_group, unnamed]
    assert len(found) == 4 and "line 3" in next(w for w in found if w.startswith(broken))


def test_a_plugin_in_a_group_paged_bench_does_not_read_is_named_with_the_group_to_use(tmp_path, site):
    # was: "router='fewest' is not allowed: one of least_kv, ..." for an option --plugins had listed
    proc = run_cli(tmp_path, "router=fewest", "cluster.replicas=2", "tracking.enabled=false", PYTHONPATH=site)
    assert proc.returncode == 2, proc.stderr
    assert ("error: router plugin 'fewest' (slip_plugins:Fewest) from package slip-plugins is registered in "
            "entry-point group paged_bench.router, which paged_bench does not read: register it in "
            "paged_bench.routers") in proc.stderr.splitlines()  # fmt: skip


def _keyword_or_positional(self, num_requests=4):  # Python passes it by name all the same
    self.num_requests = num_requests


def _keyword_only(self, *, num_requests):
    self.num_requests = num_requests


def _installed(monkeypatch, name: str, init) -> None:
    """A workload plugin ``name`` whose ``__init__`` is ``init``, as if a package registered it."""
    cls = type(name.title(), (Workload,), {"name": name, "__init__": init, "requests": lambda self, ctx: []})
    load = registry.load
    monkeypatch.setattr(registry, "load", lambda kind, n: cls if n == name else load(kind, n))


def test_options_that_are_positional_or_keyword_arguments_are_taken(monkeypatch):
    # was: "workload.num_requests=4 is not allowed: workload 'fixed' takes no options"
    _installed(monkeypatch, "fixed", _keyword_or_positional)
    assert registry.create("workload", "fixed", num_requests=7).num_requests == 7
    with pytest.raises(Exception, match=r"workload 'fixed' takes num_requests$"):
        registry.create("workload", "fixed", max_concurrency=2)


def test_an_entry_point_name_a_built_in_has_says_what_to_do(tmp_path):
    site = fake_distribution(tmp_path / "site", "twin-plugins", {"paged_bench.workloads": {"uniform": "twin:W"}}, {})
    proc = run_cli(tmp_path, "workload=uniform", "tracking.enabled=false", PYTHONPATH=str(site))
    assert proc.returncode != 0
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: workload plugin 'uniform' is registered more than once: ")
    assert "paged_bench.workloads.uniform:UniformWorkload from paged-bench" in line and "twin:W from twin-plugins" in line
    assert line.endswith("; rename the entry point of a package's own plugin, or uninstall one of the packages")


def test_an_option_the_file_does_not_give_says_where_options_come_from(monkeypatch):
    # was: "... missing 1 required keyword-only argument: 'num_requests' (raised at registry.py:139 in create)"
    _installed(monkeypatch, "needs", _keyword_only)
    with pytest.raises(Exception) as e:
        registry.create("workload", "needs")
    assert str(e.value).endswith("failed to build: TypeError: _keyword_only() missing 1 required keyword-only "
                                 "argument: 'num_requests' (its options come from its option file, or "
                                 "+workload.KEY=VALUE)")  # fmt: skip


BAD_HOOK = """from paged_bench.core.scheduler.continuous import ContinuousScheduler


class Picky(ContinuousScheduler):
    name = "picky"

    def pick_waiting(self, how):
        return self.waiting[0]

    def choose_victim(self, req, reason=None):  # one more, with a default: called as the base's, it fits
        return super().choose_victim(req)
"""


def test_a_hook_whose_parameters_the_engine_cannot_pass_is_refused_before_the_run(tmp_path):
    # was a TypeError at the first admission, "raised at paged_bench/core/scheduler/base.py", and a traceback
    site = fake_distribution(tmp_path / "site", "picky-plugins", {"paged_bench.schedulers": {"picky": "picky:Picky"}},
                             {"picky": BAD_HOOK})  # fmt: skip
    proc = run_cli(tmp_path, "scheduler.name=picky", "tracking.enabled=false", PYTHONPATH=str(site))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: scheduler plugin 'picky' (picky:Picky) from package picky-plugins overrides pick_waiting(self, how), "
        "which is called as pick_waiting(self): take Scheduler.pick_waiting's parameters (more only with defaults)")
    assert not list(tmp_path.glob("runs/*/*/summary.json"))
