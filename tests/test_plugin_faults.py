"""A policy plugin that misbehaves mid-run: its hook raises, or answers what the machinery
cannot act on (a victim that is not running, a waiting request that is not waiting, a replica
index past the cluster). The run stops as on an engine error: every request is ended with the
reason, the pool is whole, what ran is on disk, and the error is one line naming the hook (and
where a crash was raised) with a non-zero exit. Before, the exception went up through the CLI
as a traceback with the pool held and no files written."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from paged_bench.backends.sim import SimBackend
from paged_bench.cluster.cluster_bench import build_cluster
from paged_bench.cluster.spec import cluster_spec
from paged_bench.core.engine import Engine
from paged_bench.core.kv.base import KVLayout
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import StepOutput
from paged_bench.core.request import FinishReason
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from paged_bench.errors import PluginError
from paged_bench.routers.base import Router
from paged_bench.run.bench import build
from paged_bench.run.compose import compose_config
from tests.plugin_support import fake_distribution
from tests.tracking_support import run_cli

FAULTY = '''from paged_bench.core.scheduler.base import Scheduler


class CrashesLater(Scheduler):
    """FCFS until 5 requests have finished; then its admission hook raises."""

    done = 0

    def update(self, plan, output, now):
        finished = super().update(plan, output, now)
        self.done += len(finished)
        return finished

    def may_admit(self, draft):
        if self.done >= 5:
            raise RuntimeError("admission table is corrupt")
        return True
'''
RAISED_AT = FAULTY.splitlines().index('            raise RuntimeError("admission table is corrupt")') + 1


def _engine_with(cls, *overrides):
    bench = build(compose_config("backend=sim", "tracking.enabled=false", *overrides))
    built = bench.engine.scheduler  # the same settings, another policy
    sched = cls(built.allocator, max_model_len=built.max_model_len, max_batch=built.max_batch,
                max_num_batched_tokens=built.max_num_batched_tokens, chunked_prefill=built.chunked_prefill)
    return Engine(sched, bench.engine.backend, bench.engine.clock), bench.requests


class VictimNotRunning(ContinuousScheduler):
    def choose_victim(self, req):
        return self.waiting[0]


class PicksARunningOne(ContinuousScheduler):
    def pick_waiting(self):
        return self.running[0] if self.running else self.waiting[0]


@pytest.mark.parametrize("cls, says", [
    (VictimNotRunning, "choose_victim() returned request "),
    (PicksARunningOne, "pick_waiting() returned request "),
])  # fmt: skip
def test_a_hook_answer_the_machinery_cannot_act_on_stops_the_run_whole(cls, says):
    short_pool = ("workload.num_requests=30", "num_blocks=12", "max_model_len=128", "workload.rate=50")
    engine, requests = _engine_with(cls, *short_pool)
    result = engine.run(requests)
    assert result.error.startswith(f"scheduler {cls.name!r}: {says}") and "which is not" in result.error
    assert all(r.is_finished for r in result.requests)
    assert len(result.steps) > 0  # what ran before stays
    errors = {r.error for r in result.requests if r.finish_reason is FinishReason.ERROR}
    assert errors <= {result.error, f"not submitted: {result.error}"}
    assert result.leaks == [] and engine.allocator.num_free_blocks == engine.allocator.layout.num_blocks


class BackwardsRouter(Router):
    name = "backwards"

    def route(self, req, replicas):
        return -1  # indexes the last replica from the end: silently another replica


def test_a_router_index_outside_the_cluster_stops_the_run_whole():
    cfg = compose_config("backend=sim", "tracking.enabled=false", "cluster.replicas=2", "workload.num_requests=20")
    bench = build_cluster(cfg, cluster_spec(cfg))
    bench.cluster.router = BackwardsRouter()
    run = bench.cluster.run(bench.requests)
    assert run.error == "router 'backwards': route() returned -1 for request 0, not the index of one of its 2 " \
                        "replicas (0 to 1)"  # fmt: skip
    assert all(r.is_finished and r.finish_reason is FinishReason.ERROR for r in run.requests)


def test_a_crashing_plugin_keeps_what_ran_and_exits_with_one_line(tmp_path):
    site = fake_distribution(tmp_path / "site", "faulty-plugins",
                             {"paged_bench.schedulers": {"crashes_later": "faulty_plugins.scheduler:CrashesLater"}},
                             {"faulty_plugins.scheduler": FAULTY})  # fmt: skip
    proc = run_cli(tmp_path, "scheduler.name=crashes_later", "tracking.enabled=false", "max_batch=4",
                   PYTHONPATH=str(site))  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    where = f"(raised at faulty_plugins/scheduler.py:{RAISED_AT} in may_admit)"  # the package's file, by its path
    assert f"run failed: RuntimeError: admission table is corrupt {where}" in line
    (run_dir,) = [p.parent for p in tmp_path.glob("runs/20*/*/summary.json")]
    assert "results so far are in" in line and str(run_dir.name) in line
    rows = list(csv.DictReader((run_dir / "requests.csv").open()))
    assert len(rows) == 48 and sum(r["finish_reason"] == "length" for r in rows) >= 5
    assert {r["finish_reason"] for r in rows} == {"length", "error"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] >= 5 and summary["completed"] + summary["failed"] == 48
    assert "Traceback" in (run_dir / "__main__.log").read_text()  # the whole traceback, for the plugin's author


# -- plugins of the other kinds, wrong in ways an author's first try is (an audit wrote five) --



class OneTokenBackend(SimBackend):
    def execute(self, plan):
        return StepOutput([0], 0.01)  # one token whatever the rows: the rest were dropped silently


class NeverFrees(PagedAllocator):
    def free(self, req):
        pass  # and its own leaks() says nothing

    def leaks(self):
        return []


def test_a_backend_that_returns_too_few_tokens_stops_the_run_naming_it():
    engine, requests = _engine_with(ContinuousScheduler, "workload.num_requests=8")
    engine.backend = OneTokenBackend()
    result = engine.run(requests)
    assert result.error.startswith("backend 'sim' returned 1 token (int) and a duration of 0.01 s for a step of ")
    assert "execute() returns a paged_bench.core.plan.StepOutput of one token id (an int >= 0) per row" in result.error


class ReturnsAList(SimBackend):
    def execute(self, plan):
        return [0] * len(plan.req_ids)


class NoDuration(SimBackend):
    def execute(self, plan):
        return StepOutput([0] * len(plan.req_ids), None)


class FloatTokens(SimBackend):
    def execute(self, plan):
        return StepOutput([0.5] * len(plan.req_ids), 0.01)


class NegativeTokens(SimBackend):
    def execute(self, plan):
        return StepOutput([-1] * len(plan.req_ids), 0.01)  # no vocabulary index: a request cannot hold it


@pytest.mark.parametrize("cls, shown", [
    (ReturnsAList, "returned list for a step"),
    (NoDuration, " (int) and a duration of None s"),
    (FloatTokens, " (float) and a duration of 0.01 s"),
    (NegativeTokens, " (int) and a duration of 0.01 s"),
])  # fmt: skip
def test_a_backend_output_of_the_wrong_type_names_the_backend(cls, shown):
    # these failed inside the engine or the scheduler (AttributeError at engine.py, TypeError at
    # base.py: the scheduler's file), pointing a backend's author at the wrong plugin
    engine, requests = _engine_with(ContinuousScheduler, "workload.num_requests=8")
    engine.backend = cls()
    result = engine.run(requests)
    assert result.error.startswith("backend 'sim' ") and shown in result.error, result.error
    assert result.leaks == [] and all(r.is_finished for r in result.requests)


class NumpyNumbers(SimBackend):
    def execute(self, plan):
        return StepOutput([np.int64(0)] * len(plan.req_ids), np.float32(0.01))


def test_numpy_tokens_and_a_numpy_duration_are_well_formed():
    # a float32 duration (a cost computed in numpy) must not be taken for a broken plugin's
    engine, requests = _engine_with(ContinuousScheduler, "workload.num_requests=8")
    engine.backend = NumpyNumbers()
    result = engine.run(requests)
    assert result.error is None and all(r.finish_reason.succeeded for r in result.requests)


class AdmitsNone(ContinuousScheduler):
    def may_admit(self, plan):
        plan.num_preempted == 0  # noqa: B015 - the forgotten return under test


def test_a_may_admit_that_returns_no_bool_is_named():
    # it read as "planned an empty step with 0 running and 1 waiting requests"
    engine, requests = _engine_with(AdmitsNone, "workload.num_requests=8")
    result = engine.run(requests)
    assert result.error == "scheduler 'continuous': may_admit() returned None, which is not a bool: return True or False"


def test_an_allocator_that_skips_its_base_init_is_refused_before_the_run(monkeypatch):
    # without counters the run finished and then crashed writing its results: nothing was kept
    from paged_bench.run import registry

    class NoCounters(PagedAllocator):
        def __init__(self, *, num_blocks, block_size, **kwargs):
            self.layout = KVLayout(num_blocks, block_size, 0)  # its own, and no base __init__

    load = registry.load
    monkeypatch.setattr(registry, "load", lambda kind, name: NoCounters if kind == "allocator" else load(kind, name))
    with pytest.raises(PluginError, match="allocator 'paged' sets no self.counters \\(a paged_bench.core.kv.base."
                                          "AllocatorCounters\\): call the base class's __init__"):  # fmt: skip
        build(compose_config("backend=sim", "tracking.enabled=false"))


def test_a_plugin_class_without_a_name_takes_its_entry_points(monkeypatch):
    # every hook error said scheduler '' (or the name of the example the class was copied from)
    from paged_bench.run import registry

    class Nameless(ContinuousScheduler):
        name = ""

    load = registry.load
    monkeypatch.setattr(registry, "load", lambda kind, name: Nameless if kind == "scheduler" else load(kind, name))
    bench = build(compose_config("backend=sim", "tracking.enabled=false", "scheduler.name=continuous"))
    assert bench.engine.scheduler.name == "continuous"


def test_an_option_file_without_a_name_or_a_backend_of_unknown_kv_size_is_one_line(config):
    from paged_bench.errors import ConfigError
    from paged_bench.run.config import plugin_section

    with pytest.raises(ConfigError) as e:  # read as "router={'tie_break': 'kv'} is not allowed: a router option"
        plugin_section({"router": {"tie_break": "kv"}}, "router")
    assert str(e.value).startswith("router.name=None is not allowed: the name of an installed router plugin: every "
                                   "router option file sets name: to its plugin's entry-point name")  # fmt: skip
    # a backend plugin with no K/V size of its own was priced as the 4-layer test model in a split
    # cluster: transfers 64x cheaper than the documented llama-3-8b's, without a word
    cfg = config("cluster.prefill_replicas=1", "cluster.decode_replicas=1", "~backend.model", "tracking.enabled=false")
    with pytest.raises(ConfigError) as e:
        build_cluster(cfg, cluster_spec(cfg))
    assert e.value.key == "backend" and "sets kv_bytes_per_token, or takes a model or model_path option" in str(e.value)


def test_blocks_an_allocator_never_gives_back_are_reported_whatever_its_leaks_says():
    bench = build(compose_config("backend=sim", "tracking.enabled=false", "workload.num_requests=8"))
    engine, layout = bench.engine, bench.engine.allocator.layout
    never = NeverFrees(num_blocks=layout.num_blocks, block_size=layout.block_size)
    engine.scheduler.allocator = engine.allocator = never
    result = engine.run(bench.requests)
    assert any(leak.startswith("allocator 'paged' has ") and "blocks free" in leak for leak in result.leaks)
    assert any("live slots" in leak for leak in result.leaks)
    never.leaks = lambda: ["3 requests still hold block tables"]  # its own words, named by the engine
    assert engine.result(bench.requests, None, False).leaks == ["allocator 'paged': 3 requests still hold block tables"]


def test_a_plugin_constructor_that_fails_is_one_line_naming_it(monkeypatch):
    """Forgetting **kwargs blamed the user's config ("scheduler.max_model_len=512 is not
    allowed"); an abstract method left out was a 40-line traceback."""
    from paged_bench.core.kv.base import Allocator
    from paged_bench.core.scheduler.base import Scheduler
    from paged_bench.run import registry

    class NoKwargs(Scheduler):
        def __init__(self, allocator, *, resume_first=False):
            super().__init__(allocator, max_model_len=64, max_batch=4, max_num_batched_tokens=64)

    class LeftAbstract(Allocator):
        pass

    class LeavesOne(PagedAllocator):
        leaks = Allocator.leaks

    monkeypatch.setattr(registry, "load", lambda kind, name: NoKwargs)
    with pytest.raises(PluginError) as e:
        registry.create("scheduler", "lpf", None, internal=("max_model_len",), max_model_len=512)
    assert str(e.value) == ("scheduler plugin 'lpf' (not an installed entry point) does not take max_model_len, "
                            "which paged_bench passes to every scheduler: take **kwargs in __init__ and pass them on "
                            "to its base class")  # fmt: skip
    monkeypatch.setattr(registry, "load", lambda kind, name: LeftAbstract)
    with pytest.raises(PluginError, match="allocator plugin 'simple' .* failed to build: TypeError: Can't instantiate "
                                          "abstract class LeftAbstract with abstract methods allocate_slots, "
                                          "block_table, free, leaks, live_slots, lookup_prefix, "
                                          "num_free_blocks$"):  # fmt: skip
        registry.create("allocator", "simple")
    # compiled, Python itself sees no abstract method (the marks are lost): one left out ran as a no-op
    monkeypatch.setattr(registry, "load", lambda kind, name: LeavesOne)
    with pytest.raises(PluginError, match="abstract class LeavesOne with abstract methods leaks$"):
        registry.create("allocator", "simple", num_blocks=8, block_size=16)


def test_the_allocator_names_its_abstract_methods_as_marked():
    """``abstract_methods`` is what the registry checks once the marks are compiled away."""
    import ast

    from paged_bench.core.kv import base
    from paged_bench.native.guard import source

    tree = ast.parse(source(base.__name__).read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Allocator")
    marked = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)
              and any(isinstance(d, ast.Name) and d.id == "abstractmethod" for d in f.decorator_list)}  # fmt: skip
    assert set(base.Allocator.abstract_methods) == marked


def test_an_allocator_that_keeps_its_own_block_size_is_refused(monkeypatch):
    """An option file without block_size: ${block_size} ran with the plugin's default: the config
    said 8, the pool was 16-token blocks (twice the memory)."""
    from paged_bench.run import registry

    class OwnBlockSize(PagedAllocator):
        def __init__(self, *, num_blocks, **kwargs):
            super().__init__(num_blocks=num_blocks, block_size=16)

    load = registry.load
    monkeypatch.setattr(registry, "load", lambda kind, name: OwnBlockSize if kind == "allocator" else load(kind, name))
    with pytest.raises(PluginError, match="allocator 'paged' made a pool of block_size=16, not the configured 8: its "
                                          "option file needs block_size: \\$\\{block_size\\}"):  # fmt: skip
        build(compose_config("backend=sim", "tracking.enabled=false", "block_size=8"))


def test_a_workload_that_returns_no_list_of_requests_or_shared_ids_is_named():
    from paged_bench.run.bench import workload_requests

    bench = build(compose_config("backend=sim", "tracking.enabled=false", "workload.num_requests=3"))

    class Plugin:
        name = "replay"

        def __init__(self, reqs):
            self.reqs = reqs

        def requests(self, ctx):
            return self.reqs

    with pytest.raises(PluginError, match="workload 'replay': requests\\(\\) returned list_iterator, not a list of"):
        workload_requests(Plugin(iter(bench.requests)), bench.backend)
    twins = [bench.requests[0], bench.requests[0]]
    with pytest.raises(PluginError, match="returned requests sharing a request_id; each needs its own"):
        workload_requests(Plugin(twins), bench.backend)
