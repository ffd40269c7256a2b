"""A run's config, typed and checked once, where it comes in (vLLM's ``VllmConfig`` and its parts).

Hydra resolves the config into a plain mapping; ``BenchConfig.from_config`` reads it, in one
place, into typed settings: the top-level knobs (``SchedulerSettings``, ``CacheSettings``,
``RunSettings``) and one ``PluginChoice`` per plugin kind, whose options the plugin's schema
checks (``plugin_options``: the built-in plugins', a third-party plugin checks its own). Each
check lives in its dataclass's ``__post_init__`` and raises one ``ConfigError`` naming the key
as the user wrote it. What the engine derives later (``max_model_len=auto`` from the backend's
model) goes in with ``dataclasses.replace``, which checks again what depends on it, as vLLM's
configs do once the model is known. The engine is built from these (``run.bench``), a
cluster's replicas from the same ones, and a sweep checks each job with them before the first runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from paged_bench.errors import MAX_TOKENS, ConfigError, check, check_int, check_number
from paged_bench.report.axes import check_declared
from paged_bench.results.metrics import SLO_KEYS
from paged_bench.run import registry
from paged_bench.run.compose import check_settings
from paged_bench.run.frontend import FrontendSettings
from paged_bench.run.plugin_options import PluginOptions

PLUGIN_KINDS = ("workload", "scheduler", "allocator", "backend")
# allocator options copied from the top level (``allocator.block_size: ${block_size}``)
MIRRORED_KNOBS = ("num_blocks", "block_size", "max_model_len")
# scheduler options copied from the top level, which sizes the pool, the backend's activations and
# its per-step cap: an option file may set a lower value (a narrower policy), never a higher one
CAPPED_KNOBS = ("max_batch", "max_num_batched_tokens")
CLOCKS = ("auto", "virtual", "wall")
# what the engine passes a plugin of a kind besides its section's options (not the user's to set)
ENGINE_PASSES = {"scheduler": ("max_model_len", "eos_token_id", "stop_token_ids")}


@dataclass(frozen=True)
class CacheSettings:
    """The KV pool the top level sizes (vLLM's ``CacheConfig``): ``num_blocks`` blocks of
    ``block_size`` tokens; null or auto, what the backend's memory holds next to its model
    (or room for ``max_batch`` full-length sequences), sized once the backend is built."""

    block_size: int
    num_blocks: int | Literal["auto"] | None = None

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, 1, MAX_TOKENS)
        if not self.auto_sized:
            check_int("num_blocks", self.num_blocks)

    @property
    def auto_sized(self) -> bool:
        return self.num_blocks in (None, "auto")


@dataclass(frozen=True)
class SchedulerSettings:
    """The engine's limits (vLLM's ``SchedulerConfig``): at most ``max_batch`` sequences at once,
    ``max_num_batched_tokens`` a step, ``max_model_len`` tokens a sequence (auto: the model's
    context, known once the backend is built)."""

    max_batch: int
    max_num_batched_tokens: int
    max_model_len: int | Literal["auto"]

    def __post_init__(self) -> None:
        check_int("max_batch", self.max_batch)
        if self.max_model_len != "auto":
            try:
                check_int("max_model_len", self.max_model_len, 2)
            except ConfigError as e:
                raise ConfigError(e.key, e.value, f"{e.allowed}, or auto (the model's context)") from None
        check_int("max_num_batched_tokens", self.max_num_batched_tokens)

    @property
    def model_len(self) -> int:
        """``max_model_len`` once it is known (after ``BenchConfig.with_model_len``)."""
        if self.max_model_len == "auto":
            raise RuntimeError("max_model_len=auto is resolved from the backend's model before it is read")
        return self.max_model_len


@dataclass(frozen=True)
class RunSettings:
    """What a run is besides its engine: the seed of its workload, its clock (auto: the
    backend's), its SLOs (goodput counts the requests that meet them all), its target
    (``engine``: in process; ``openai``, ``served``: a server, whose options loadgen reads) and
    the front end an in-process run prices (``run.frontend``; a server target has a real one)."""

    seed: int = 0
    clock: Literal["auto", "virtual", "wall"] = "auto"
    slo: Mapping[str, float | None] = field(default_factory=dict)
    target: str = "engine"
    frontend: FrontendSettings = field(default_factory=FrontendSettings)

    def __post_init__(self) -> None:
        check_int("seed", self.seed, 0)
        check(self.clock in CLOCKS, "clock", self.clock, "auto, virtual or wall")
        check(isinstance(self.slo, Mapping), "slo", self.slo, f"a mapping with keys {', '.join(SLO_KEYS)}")
        for key, value in self.slo.items():
            check(key in SLO_KEYS, f"slo.{key}", value, f"one of {', '.join(SLO_KEYS)}")
            if value is not None:
                check_number(f"slo.{key}", value, 0, strict=True, finite=False)
        if self.target != "engine":
            self.frontend.refuse_priced(f"frontend=none with target={self.target} (a server's own front end is "
                                        "measured; frontend prices one for target=engine)")  # fmt: skip

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> RunSettings:
        target = cfg.get("target")
        if isinstance(target, Mapping) and target.get("name") == "engine":
            # the in-process engine takes no target options: +target.base_url=... beside it ran
            # the engine and measured no server, without a word
            for key, value in target.items():
                check(key == "name", f"target.{key}", value,
                      "no option with target=engine (the in-process engine); target=openai sends to a server")  # fmt: skip
        name = target.get("name", "engine") if isinstance(target, Mapping) else "engine"
        frontend = FrontendSettings.from_config(cfg.get("frontend"))
        return cls(given(cfg, "seed"), cfg.get("clock", "auto"), cfg.get("slo") or {}, name, frontend)


@dataclass(frozen=True)
class TopLevel:
    """A config's top-level knobs, checked: what every run has whatever its plugins."""

    scheduler: SchedulerSettings
    cache: CacheSettings
    run: RunSettings


def check_top_level(cfg: Mapping[str, Any]) -> TopLevel:
    """``cfg``'s top level, typed; ConfigError for an unknown key or the first bad value."""
    check_settings(cfg)
    cache = CacheSettings(given(cfg, "block_size"), cfg.get("num_blocks"))
    scheduler = SchedulerSettings(given(cfg, "max_batch"), given(cfg, "max_num_batched_tokens"),
                                  given(cfg, "max_model_len"))  # fmt: skip
    return TopLevel(scheduler, cache, RunSettings.from_config(cfg))


def given(cfg: Mapping[str, Any], key: str) -> Any:
    """``key``'s value as the config gives it (None where it has none), for a dataclass to check."""
    return cfg.get(key)


@dataclass(frozen=True)
class PluginChoice:
    """One plugin kind's section: the plugin (its entry-point name and its class), the options
    its section gives it, and those options as its schema reads them, checked (None: a plugin
    with none of our classes as its base, which checks its own; see ``registry.schema_of``)."""

    kind: str
    name: str
    plugin: type
    options: Mapping[str, Any]
    checked: PluginOptions | None = None

    @classmethod
    def from_section(cls, kind: str, name: str, options: Mapping[str, Any], *, num_positional: int = 0,
                     internal: Mapping[str, object] | None = None) -> PluginChoice:  # fmt: skip
        """Plugin ``name`` of ``kind`` with ``options`` checked: their names against what its
        class takes (``num_positional``: arguments the engine passes it by position), their
        values by its schema, which also reads ``internal``: values the engine passes it."""
        plugin = registry.load(kind, name)
        registry.check_option_names(kind, name, plugin, num_positional, options, ENGINE_PASSES.get(kind, ()))
        return cls(kind, name, plugin, dict(options), registry.checked_options(plugin, {**options, **(internal or {})}))

    def with_options(self, **derived: Any) -> PluginChoice:
        """This choice with the options the engine derived (a pool's size, a model's context)
        where its section has them, checked again by its schema."""
        given = {key: value for key, value in derived.items() if key in self.options}
        checked = self.checked
        if checked is not None:
            checked = replace(checked, **{f.name: derived[f.name] for f in fields(checked) if f.name in derived})
        return replace(self, options={**self.options, **given}, checked=checked)

    def build(self, *args: Any, **internal: Any) -> Any:
        """The plugin, built from its checked options and ``internal`` (values the engine passes),
        once its options are verified against each other."""
        passes = ENGINE_PASSES.get(self.kind, ())
        registry.check_option_names(self.kind, self.name, self.plugin, len(args), internal, passes)
        if self.checked is not None:
            self.checked.verify()
        return registry.construct(self.kind, self.name, self.plugin, *args, **self.options, **internal)


def plugin_section(cfg: Mapping[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    """The plugin a section names and its options (the rest of the section)."""
    section = cfg.get(kind)
    if isinstance(section, Mapping) and not isinstance(section.get("name"), str):
        # an option file (a plugin's, most likely) that forgot its name: key
        raise ConfigError(f"{kind}.name", section.get("name"), f"the name of an installed {kind} plugin: every {kind} "
                          f"option file sets name: to its plugin's entry-point name (see --plugins)")  # fmt: skip
    if not isinstance(section, Mapping):
        raise ConfigError(kind, section, f"a {kind} config group option, e.g. {kind}=<name> (see --help)")
    options = dict(section)
    return options.pop("name"), options


def _check_mirrors(top: TopLevel, sections: Mapping[str, tuple[str, dict[str, Any]]], cfg: Mapping[str, Any]) -> None:
    """An allocator's copy of a top-level knob (``allocator.block_size: ${block_size}``) must be
    that knob, and a scheduler's may not exceed it: the pool's size, the backend's limits and
    the memory check read the top level (``scheduler.max_batch=64`` alone ran out of KV blocks
    in a pool sized for 16, and passed a backend that serves one request at a time)."""
    _, allocator = sections["allocator"]
    for key in MIRRORED_KNOBS:
        if key in allocator and allocator[key] != cfg.get(key):
            value = "null" if cfg.get(key) is None else cfg.get(key)
            raise ConfigError(f"allocator.{key}", allocator[key],
                              f"{key}'s value, {value} (set the top-level {key}: the pool's size and the backend "
                              "follow it)")  # fmt: skip
    _, scheduler = sections["scheduler"]
    limits = {"max_batch": top.scheduler.max_batch, "max_num_batched_tokens": top.scheduler.max_num_batched_tokens}
    for key in CAPPED_KNOBS:
        if key in scheduler and not (isinstance(scheduler[key], int) and scheduler[key] <= limits[key]):
            raise ConfigError(f"scheduler.{key}", scheduler[key],
                              f"at most {key}'s value, {limits[key]} (set the top-level {key}: the pool, the backend "
                              "and the memory check follow it)")  # fmt: skip
    # a backend that serves a fixed number of requests at once says so in its options: refused
    # before its model loads, rather than at the first step that holds more
    name, backend = sections["backend"]
    cap = backend.get("max_batch")
    if isinstance(cap, int) and top.scheduler.max_batch > cap:
        raise ConfigError("max_batch", top.scheduler.max_batch,
                          f"at most {cap} with backend={name} (backend.max_batch: it serves {cap} request(s) at a time)")


@dataclass(frozen=True)
class BenchConfig:
    """A run's whole config, typed and checked: the top level's settings, one plugin choice per
    kind (workload, scheduler, allocator, backend), and the resolved mapping it was read from
    (what ``config.yaml`` records, and what a server target and the cluster read of it)."""

    scheduler: SchedulerSettings
    cache: CacheSettings
    run: RunSettings
    plugins: Mapping[str, PluginChoice]
    source: Mapping[str, Any]

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> BenchConfig:
        """Read a resolved config (``OmegaConf.to_container``): ConfigError for the first bad
        value, named as the config names it. Its plugins are loaded, none is built."""
        top = check_top_level(cfg)
        # an experiment's report axes: a typo found now, not after the sweep, when its report is drawn
        check_declared(cfg.get("report"), cfg)
        sections = {kind: plugin_section(cfg, kind) for kind in PLUGIN_KINDS}
        _check_mirrors(top, sections, cfg)
        plugins = {kind: PluginChoice.from_section(kind, *sections[kind]) for kind in ("workload", "backend", "allocator")}
        # the scheduler takes the allocator by position, and its schema reads the top level's max_model_len
        internal = {"max_model_len": top.scheduler.max_model_len}
        plugins["scheduler"] = PluginChoice.from_section("scheduler", *sections["scheduler"], num_positional=1,
                                                         internal=internal)  # fmt: skip
        return cls(top.scheduler, top.cache, top.run, {kind: plugins[kind] for kind in PLUGIN_KINDS}, dict(cfg))

    def verify(self) -> None:
        """The checks the engine makes across a plugin's options as it builds it, made now (a
        sweep's, before its first job): those that need the backend's model wait for it."""
        for choice in self.plugins.values():
            if choice.checked is not None:
                choice.checked.verify()

    @property
    def choices(self) -> dict[str, str]:
        """The plugin per kind: what ``run_info.json`` records."""
        return {kind: choice.name for kind, choice in self.plugins.items()}

    def with_model_len(self, max_model_len: int) -> BenchConfig:
        """``max_model_len=auto`` made the model's context: the top level's, the allocator's copy
        of it, and what the scheduler's schema checks against it."""
        plugins = {**self.plugins, "allocator": self.plugins["allocator"].with_options(max_model_len=max_model_len),
                   "scheduler": self.plugins["scheduler"].with_options(max_model_len=max_model_len)}  # fmt: skip
        return replace(self, scheduler=replace(self.scheduler, max_model_len=max_model_len), plugins=plugins)
