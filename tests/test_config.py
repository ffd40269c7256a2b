"""A run's config, typed and checked once where it is read (``run.config``, ``run.plugin_options``,
``run.backend_options``): every check's one line, the defaults, what the engine derives later
(``max_model_len=auto``) checked once known, the checks across options made as the engine
builds (after the pool's memory check), the built-in schemas applied to a plugin derived from
a built-in class, and a value every job of a sweep refuses, refused before the first job runs."""

from __future__ import annotations

import inspect

import pytest

from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.scheduler.continuous import ContinuousScheduler
from paged_bench.errors import ConfigError, PluginError
from paged_bench.run import memory, registry
from paged_bench.run.backend_options import NumpyOptions, SimOptions, TorchOptions
from paged_bench.run.bench import build, build_engine, typed
from paged_bench.run.config import BenchConfig, CacheSettings, RunSettings, SchedulerSettings
from paged_bench.run.plugin_options import ContiguousOptions, PagedOptions, PreemptiveOptions, SchedulerOptions
from tests.test_cli_edges import command, one_error_line

LIMITS = {"max_batch": 4, "max_num_batched_tokens": 64}


@pytest.mark.parametrize("make, expected", [
    (lambda: SchedulerSettings(0, 8192, 512), "max_batch=0 is not allowed: an integer >= 1"),
    (lambda: SchedulerSettings(16, 8192, 1), "max_model_len=1 is not allowed: an integer >= 2, or auto (the model's"),
    (lambda: SchedulerSettings(16, 8192, "x"), "max_model_len='x' is not allowed: an integer >= 2, or auto"),
    (lambda: SchedulerSettings(16, True, 512), "max_num_batched_tokens=True is not allowed: an integer >= 1"),
    (lambda: CacheSettings(0), "block_size=0 is not allowed: an integer from 1 to 2,147,483,647"),
    (lambda: CacheSettings(16, "abc"), "num_blocks='abc' is not allowed: an integer >= 1"),
    (lambda: RunSettings(seed=-1), "seed=-1 is not allowed: an integer >= 0"),
    (lambda: RunSettings(clock="sometimes"), "clock='sometimes' is not allowed: auto, virtual or wall"),
    (lambda: RunSettings(slo={"ttft_ms": -5}), "slo.ttft_ms=-5 is not allowed: a number > 0"),
    (lambda: RunSettings(slo={"bogus": 1}), "slo.bogus=1 is not allowed: one of ttft_ms, tpot_ms, e2el_ms"),
    (lambda: RunSettings(slo=[1]), "slo=[1] is not allowed: a mapping with keys ttft_ms, tpot_ms, e2el_ms"),
    (lambda: SchedulerOptions(max_batch=0, max_num_batched_tokens=64), "max_batch=0 is not allowed: an integer >= 1"),
    (lambda: SchedulerOptions(max_batch=16, max_num_batched_tokens=8).verify(),
     "max_num_batched_tokens=8 is not allowed: >= max_batch=16 (each running sequence needs a token a step)"),
    (lambda: SchedulerOptions(**LIMITS, chunked_prefill="maybe"),
     "scheduler.chunked_prefill='maybe' is not allowed: true or false"),
    (lambda: SchedulerOptions(**LIMITS, chunked_prefill=False, max_model_len=256).verify(),
     "max_num_batched_tokens=64 is not allowed: >= max_model_len=256 when chunked_prefill is off"),
    (lambda: PreemptiveOptions(**LIMITS, mode="evict"), "scheduler.mode='evict' is not allowed: recompute or swap"),
    (lambda: PreemptiveOptions(**LIMITS, watermark=1.0),
     "scheduler.watermark=1.0 is not allowed: a fraction of the pool in [0, 1)"),
    (lambda: PreemptiveOptions(**LIMITS, watermark="abc"),
     "scheduler.watermark='abc' is not allowed: a finite number >= 0.0"),
    (lambda: PreemptiveOptions(**LIMITS, victim="oldest"),
     "scheduler.victim='oldest' is not allowed: last_admitted or latest_arrival"),
    (lambda: PagedOptions(num_blocks=4, block_size=0), "block_size=0 is not allowed: an integer from 1 to"),
    (lambda: PagedOptions(block_size=4, prefix_caching="yes"), "allocator.prefix_caching='yes' is not allowed: true"),
    (lambda: PagedOptions(block_size=4, swap_blocks=-1), "allocator.swap_blocks=-1 is not allowed: an integer >= 0"),
    (lambda: PagedOptions(block_size=4, prefix_hash="md5"), "allocator.prefix_hash='md5' is not allowed: builtin or"),
    (lambda: PagedOptions(block_size=4, defer_unshared=1), "allocator.defer_unshared=1 is not allowed: true or false"),
    (lambda: ContiguousOptions(block_size=4, max_model_len=64, prefix_hash=[1]),
     "allocator.prefix_hash=[1] is not allowed: builtin or sha256"),
    (lambda: SimOptions(cost_model="quadratic"), "backend.cost_model='quadratic' is not allowed: linear, roofline, measured"),
    (lambda: SimOptions(step_overhead_ms=-1), "backend.step_overhead_ms=-1 is not allowed: a finite number >= 0.0"),
    (lambda: SimOptions(vocab_size=1), "backend.vocab_size=1 is not allowed: an integer >= 2"),
    (lambda: SimOptions(tensor_parallel_size=2),
     "backend.tensor_parallel_size=2 is not allowed: 1 with cost_model=linear (use cost_model=roofline or measured)"),
    (lambda: SimOptions(cost_model="measured", hardware="b200"),
     "backend.hardware='b200' is not allowed: h100, a100, a40, h200 with cost_model=measured"),
    (lambda: SimOptions(cost_model="measured", model="small"),
     "backend.dtype='float32' is not allowed: bfloat16 or float16 with cost_model=measured"),
    (lambda: SimOptions(engine_cpu="vllm_v2"), "backend.engine_cpu='vllm_v2' is not allowed: vllm_v0, none"),
    (lambda: SimOptions(all_reduce="gloo"), "backend.all_reduce='gloo' is not allowed: vllm_custom, nccl"),
    (lambda: SimOptions(gpu_memory_utilization=2), "backend.gpu_memory_utilization=2 is not allowed: a fraction"),
    (lambda: SimOptions(hardware="tpu"), "backend.hardware='tpu' is not allowed: cpu, a100, h100, h200, b200, a40"),
    (lambda: SimOptions(dtype="int3"), "backend.dtype='int3' is not allowed: float32, bfloat16, float16"),
    (lambda: SimOptions(interconnect="x"), "backend.interconnect='x' is not allowed: nvlink3"),
    (lambda: SimOptions(preset="/nonexistent.json"), "backend.preset='/nonexistent.json' is not allowed: a preset"),
    (lambda: SimOptions(cost_model="roofline", vocab_size=258),
     "backend.vocab_size=258 is not allowed: null with a roofline: its model's, 128256"),
    (lambda: SimOptions(cost_model="roofline", model="nope"), "backend.model='nope' is not allowed: one of tiny"),
    (lambda: NumpyOptions(threads=0), "backend.threads=0 is not allowed: an integer >= 1"),
    (lambda: NumpyOptions(model="nope"), "backend.model='nope' is not allowed: one of tiny"),
    (lambda: TorchOptions(threads=0), "backend.threads=0 is not allowed: an integer from 1 to 1,024"),
    (lambda: TorchOptions(tensor_parallel_size="abc"), "backend.tensor_parallel_size='abc' is not allowed: an integer"),
])  # fmt: skip
def test_each_check_is_one_line_naming_the_key(make, expected):
    with pytest.raises(ConfigError) as e:
        make()
    assert str(e.value).startswith(expected), str(e.value)


def test_the_default_config_reads_as_its_files_say(config):
    cfg = BenchConfig.from_config(config())
    assert cfg.scheduler == SchedulerSettings(max_batch=16, max_num_batched_tokens=8192, max_model_len=512)
    assert cfg.cache == CacheSettings(block_size=16, num_blocks=None) and cfg.cache.auto_sized
    assert cfg.run == RunSettings(seed=0, clock="auto", slo={"ttft_ms": None, "tpot_ms": None, "e2el_ms": None})
    assert cfg.choices == {"workload": "poisson", "scheduler": "continuous", "allocator": "paged", "backend": "sim"}
    assert cfg.plugins["scheduler"].checked == SchedulerOptions(max_batch=16, max_num_batched_tokens=8192,
                                                                 chunked_prefill=True, max_model_len=512)  # fmt: skip
    assert cfg.plugins["allocator"].checked == PagedOptions(block_size=16)
    assert cfg.plugins["backend"].checked == SimOptions()
    assert cfg.plugins["workload"].checked is None  # a workload checks its own options
    assert typed(cfg) is cfg  # read once: the engine and a cluster's replicas take it as it is


@pytest.mark.parametrize("schema", sorted(set(registry.SCHEMAS.values()), key=lambda s: s.__name__))
def test_a_schemas_defaults_are_its_plugins(schema):
    """An option a section leaves out takes the class's default: the schema checks that one."""
    targets = [t for t, s in registry.SCHEMAS.items() if s is schema]
    if "torch" in targets[0]:
        pytest.importorskip("torch")
    module, _, name = targets[0].partition(":")
    cls = getattr(__import__(module, fromlist=[name]), name)
    params = {p.name: p.default for p in inspect.signature(cls).parameters.values() if p.default is not p.empty}
    defaults = {f: v.default for f, v in schema.__dataclass_fields__.items() if f in params}
    assert defaults and all(params[f] == v for f, v in defaults.items()), (defaults, params)


def test_max_model_len_auto_is_checked_once_the_model_says(config):
    # no chunking: a prompt must fit one step, which only the model's context says for auto
    cfg = BenchConfig.from_config(config("max_model_len=auto", "scheduler.chunked_prefill=false",
                                         "max_num_batched_tokens=1024"))  # fmt: skip
    assert cfg.scheduler.max_model_len == "auto"
    cfg.verify()  # what can be known before the backend is built
    with pytest.raises(ConfigError, match=r"^max_num_batched_tokens=1024 is not allowed: >= max_model_len=2048 when"):
        cfg.with_model_len(2048).verify()
    with pytest.raises(ConfigError, match=r"^max_num_batched_tokens=1024 is not allowed: >= max_model_len=2048 when"):
        build_engine(cfg)
    resolved = BenchConfig.from_config(config("max_model_len=auto", "allocator=contiguous")).with_model_len(2048)
    assert resolved.scheduler.model_len == 2048 and resolved.plugins["allocator"].options["max_model_len"] == 2048


def test_a_run_too_big_for_memory_is_told_so_before_its_budget_is_checked(config, monkeypatch):
    # max_batch=10^9 beside the default token budget: the knob set, and why (memory), named first
    monkeypatch.setattr(memory, "available_memory", lambda: 2**30)
    with pytest.raises(ConfigError, match=r"^max_batch=1000000000 is not allowed: a KV pool of max_batch full"):
        build(config("max_batch=1000000000"))
    with pytest.raises(ConfigError, match=r"^max_num_batched_tokens=8192 is not allowed: >= max_batch=1000000000"):
        BenchConfig.from_config(config("max_batch=1000000000")).verify()


@pytest.mark.parametrize("overrides, expected", [
    (("allocator.block_size=abc",), "allocator.block_size='abc' is not allowed: block_size's value, 16 (set the"),
    (("scheduler.max_batch=100",), "scheduler.max_batch=100 is not allowed: at most max_batch's value, 16"),
    (("scheduler.bogus=1",), "scheduler.bogus=1 is not allowed: scheduler 'continuous' takes max_batch"),
    (("scheduler=preemptive", "scheduler.watermark=2"), "scheduler.watermark=2 is not allowed: a fraction"),
    (("allocator.swap_blocks=abc",), "allocator.swap_blocks='abc' is not allowed: an integer >= 0"),
    (("backend.cost_model=quadratic",), "backend.cost_model='quadratic' is not allowed: linear, roofline, measured"),
])  # fmt: skip
def test_a_config_is_refused_before_anything_is_built(config, overrides, expected, monkeypatch):
    monkeypatch.setattr(registry, "construct", lambda *a, **k: pytest.fail("built before its config was checked"))
    cfg = config(*[o if o[0] == "+" or "bogus" not in o else "+" + o for o in overrides])
    with pytest.raises(ConfigError) as e:
        build(cfg)
    assert str(e.value).startswith(expected), str(e.value)


def test_the_registry_checks_a_built_in_plugins_options_too():
    """What a direct construction of a compiled class no longer checks (it takes typed values),
    the registry does, with the same schema, for every caller that builds from options."""
    PagedAllocator(num_blocks=64, block_size=16)  # typed values, taken as they are
    with pytest.raises(ConfigError, match="^allocator.prefix_hash='md5'"):
        registry.create("allocator", "paged", num_blocks=4, block_size=4, prefix_hash="md5")
    alloc = registry.create("allocator", "paged", num_blocks=8, block_size=4)
    internal = ("max_model_len",)
    with pytest.raises(ConfigError, match="^scheduler.mode='evict'"):
        registry.create("scheduler", "preemptive", alloc, internal=internal, max_model_len=32, max_batch=2,
                        max_num_batched_tokens=64, mode="evict")  # fmt: skip
    with pytest.raises(ConfigError, match="^max_num_batched_tokens=8 is not allowed: >= max_batch=16"):
        registry.create("scheduler", "continuous", alloc, internal=internal, max_model_len=8, max_batch=16,
                        max_num_batched_tokens=8)  # fmt: skip
    with pytest.raises(ConfigError, match="^backend.threads=0"):
        registry.create("backend", "numpy", model="tiny", threads=0)


class Picky(ContinuousScheduler):
    """A plugin derived from a built-in scheduler, with an option of its own."""

    def __init__(self, allocator, *, picky=False, **kwargs):
        super().__init__(allocator, **kwargs)
        if not isinstance(picky, bool):
            raise ConfigError("scheduler.picky", picky, "true or false")
        self.picky = picky


def test_a_plugin_derived_from_a_built_in_has_its_bases_options_checked_and_checks_its_own(config, monkeypatch):
    load = registry.load
    monkeypatch.setattr(registry, "load", lambda kind, name: Picky if kind == "scheduler" else load(kind, name))
    assert registry.schema_of(Picky) is SchedulerOptions
    with pytest.raises(ConfigError, match="^scheduler.chunked_prefill='maybe' is not allowed: true or false"):
        BenchConfig.from_config(config("+scheduler.picky=true", "scheduler.chunked_prefill=maybe"))
    cfg = BenchConfig.from_config(config("+scheduler.picky=5"))  # its own option: its own check, as it is built
    with pytest.raises(ConfigError, match="^scheduler.picky=5"):
        build_engine(cfg)
    engine, _ = build_engine(config("+scheduler.picky=true", "scheduler.max_batch=2"))
    assert engine.scheduler.picky and engine.scheduler.max_batch == 2


def test_an_option_a_section_leaves_out_is_named_by_its_plugins_constructor(config):
    with pytest.raises(PluginError, match="failed to build: TypeError: .*missing .*required keyword-only argument.*"
                                          "'max_batch' \\(its options come from its option file"):  # fmt: skip
        build(config("~scheduler.max_batch"))


def test_a_value_every_job_of_a_sweep_refuses_is_refused_before_the_first_job(tmp_path):
    # each job was built, then refused, under a FAILED parent run (a plugin option, read by no
    # check of the sweep's before); a value only some jobs refuse is still theirs
    proc = command(tmp_path, "paged_bench", "-m", "max_batch=2,4", "scheduler=preemptive", "scheduler.watermark=2",
                   "tracking.enabled=false", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert one_error_line(proc) == "error: scheduler.watermark=2 is not allowed: a fraction of the pool in [0, 1)"
    assert not (tmp_path / "sweep").exists()
    proc = command(tmp_path, "paged_bench", "-m", "scheduler=preemptive", "scheduler.watermark=0.5,2",
                   "workload.num_requests=4", "tracking.enabled=false", f"hydra.sweep.dir={tmp_path / 'some'}")  # fmt: skip
    assert proc.returncode == 1 and "job #1 scheduler.watermark=2: scheduler.watermark=2 is not allowed" in proc.stderr
    assert (tmp_path / "some" / "0" / "summary.json").is_file()
