"""Plugin discovery and construction: one mechanism for built-ins and third-party packages.

Every option of the plugin kinds is an entry point in the group
``paged_bench.<kind>s`` (``paged_bench.schedulers``, ...) naming a class derived from the
kind's base class; our own built-ins register in our ``pyproject.toml`` exactly as a plugin
package does in its own. A plugin that fails to import, or is not a subclass of its kind's
base, is reported by name and package without breaking the others.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from importlib.metadata import EntryPoint, distributions, entry_points
from typing import Any

from paged_bench.errors import ConfigError, PagedBenchError, PluginError, crash_message, one_line
from paged_bench.run.backend_options import NumpyOptions, SimOptions, TorchOptions
from paged_bench.run.plugin_options import (
    ContiguousOptions,
    PagedOptions,
    PluginOptions,
    PreemptiveOptions,
    SchedulerOptions,
)

KINDS = {
    "workload": ("paged_bench.workloads", "paged_bench.workloads.base:Workload"),
    "scheduler": ("paged_bench.schedulers", "paged_bench.core.scheduler.base:Scheduler"),
    "allocator": ("paged_bench.allocators", "paged_bench.core.kv.base:Allocator"),
    "backend": ("paged_bench.backends", "paged_bench.backends.base:Backend"),
    "router": ("paged_bench.routers", "paged_bench.routers.base:Router"),  # a cluster's (paged_bench.cluster)
}


@dataclass(frozen=True)
class PluginInfo:
    kind: str
    name: str
    target: str  # "module:Class"
    package: str  # the distribution that declares it


def _base(kind: str) -> type:
    module, _, cls = KINDS[kind][1].partition(":")
    return getattr(importlib.import_module(module), cls)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise PluginError(f"unknown plugin kind {kind!r}; kinds: {', '.join(KINDS)}")


def _entry_points(kind: str) -> tuple[EntryPoint, ...]:
    _check_kind(kind)
    return _group_entry_points(KINDS[kind][0], tuple(sys.path))


@functools.lru_cache(maxsize=64)
def _group_entry_points(group: str, search_path: tuple[str, ...]) -> tuple[EntryPoint, ...]:
    """Read once per process and search path, as vLLM loads its plugins once: reading every
    installed package's metadata costs ~8 ms, and a cluster builds four plugins per replica
    (1,000 replicas took 9.5 s, 87% of it here). A package installed into a folder already on
    the path is seen by the next process."""
    return tuple(sorted(entry_points(group=group), key=lambda ep: ep.name))


def _package(ep: EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "unknown package"


def distribution(kind: str, name: str) -> str | None:
    """``package==version`` of the distribution that registers plugin ``name`` (what a rerun
    must install to run the same code); None for one not installed as a distribution."""
    ep = _entry(kind, name)
    if ep is None or ep.dist is None:
        return None
    return f"{ep.dist.name}=={ep.dist.version}"


def discover(kind: str | None = None) -> list[PluginInfo]:
    """Every registered plugin (of one kind, or all), without importing any of them."""
    kinds = [kind] if kind else list(KINDS)
    return [PluginInfo(k, ep.name, ep.value, _package(ep)) for k in kinds for ep in _entry_points(k)]


def load(kind: str, name: str) -> type:
    """The class registered as ``name`` for ``kind``."""
    matches = [ep for ep in _entry_points(kind) if ep.name == name]
    if not matches:
        if (elsewhere := _in_another_group(kind, name)) is not None:
            raise PluginError(f"{kind} plugin {name!r} ({elsewhere.value}) from package {_package(elsewhere)} is "
                              f"registered in entry-point group {elsewhere.group}, which paged_bench does not read: "
                              f"register it in {KINDS[kind][0]}")  # fmt: skip
        names = sorted({ep.name for ep in _entry_points(kind)})
        # the name comes from {kind}.name=, or from the name: key of the option file picked
        raise ConfigError(kind, name, f"one of {', '.join(names) or '(none installed)'}, the installed {kind} "
                                      f"plugins (an option file's name: key names one)")
    if len({ep.value for ep in matches}) > 1:
        where = ", ".join(f"{ep.value} from {_package(ep)}" for ep in matches)
        raise PluginError(f"{kind} plugin {name!r} is registered more than once: {where}; rename the entry point "
                          "of a package's own plugin, or uninstall one of the packages")  # fmt: skip
    ep = matches[0]
    try:
        cls = ep.load()
    except Exception as e:  # a broken plugin must not take the tool down with a traceback
        raise PluginError(f"{_plugin(kind, name, ep)} failed to load: {type(e).__name__}: {e}") from e
    base = _base(kind)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PluginError(f"{_plugin(kind, name, ep)} is not a subclass of {base.__module__}.{base.__qualname__}")
    if (problem := _hook_mismatch(cls, base)) is not None:
        raise PluginError(f"{_plugin(kind, name, ep)} {problem}")
    return cls


def _hook_mismatch(cls: type, base: type) -> str | None:
    """How ``cls`` overrides one of ``base``'s methods with parameters the engine's call does
    not fit (``pick_waiting(self, extra)``: a TypeError mid-run, pointing at the engine), or
    None. An override must take the base method's positional parameters; more need defaults."""
    for attr, hook in vars(base).items():
        mine = getattr(cls, attr, None)
        # the base's hook is a routine (a compiled class's is no Python function), the override a function
        if attr.startswith("_") or not inspect.isroutine(hook) or not inspect.isfunction(mine) or mine is hook:
            continue
        params = [p for p in inspect.signature(hook).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]  # fmt: skip
        try:
            inspect.signature(mine).bind(*(None for _ in params))
        except TypeError:
            called = ", ".join(p.name for p in params)
            return (f"overrides {attr}{inspect.signature(mine)}, which is called as {attr}({called}): take "
                    f"{base.__qualname__}.{attr}'s parameters (more only with defaults)")
    return None


def _in_another_group(kind: str, name: str) -> EntryPoint | None:
    """An entry point named ``name`` in a group like ``paged_bench.router`` (a plugin package's
    typo of ``paged_bench.routers``), which no kind reads; only looked for once ``name`` is
    not found, so the full scan costs nothing when all is well."""
    read = {group for group, _ in KINDS.values()} | {"paged_bench.conf"}
    found = (ep for dist in distributions() for ep in dist.entry_points if ep.name == name)
    return next((ep for ep in found if ep.group.startswith("paged_bench") and ep.group not in read), None)


def _plugin(kind: str, name: str, ep: EntryPoint | None) -> str:
    """How an error names a plugin: its kind, name, class and package."""
    where = f" ({ep.value}) from package {_package(ep)}" if ep is not None else " (not an installed entry point)"
    return f"{kind} plugin {name!r}{where}"


_BY_NAME = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def accepted_options(cls: type, num_positional: int = 0) -> list[str]:
    """Keyword options ``cls(...)`` accepts, following ``**kwargs`` up the class hierarchy
    (less the first ``num_positional`` parameters, which ``create`` passes by position)."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        params = _init_parameters(klass, init)
        by_position = [p for p in params if p.kind in _POSITIONAL][:num_positional]
        # keyword-only options as the docs ask, and positional-or-keyword ones too: Python passes them by name
        names += [p.name for p in params if p.kind in _BY_NAME and p not in by_position and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def _init_parameters(klass: type, init: Any) -> list[inspect.Parameter]:
    """``klass.__init__``'s parameters after self. A compiled class's ``__init__`` is a C slot
    that takes ``*args, **kwargs``: its real signature is the class's own, in which mypyc marks
    every parameter positional-only when one is a float with a default (its signature counts
    the hidden argument that says a default was taken); the compiled ``__init__`` takes them by
    name all the same (``PreemptiveScheduler``'s ``watermark``)."""
    if inspect.isfunction(init):
        return list(inspect.signature(init).parameters.values())[1:]
    params = inspect.signature(klass).parameters.values()
    return [p.replace(kind=p.POSITIONAL_OR_KEYWORD) if p.kind is p.POSITIONAL_ONLY else p for p in params]


def check_option_names(kind: str, name: str, cls: type, num_positional: int, options: Mapping[str, object],
                       internal: tuple[str, ...] = ()) -> None:  # fmt: skip
    """Every key of ``options`` is an option ``cls`` takes (``internal``: those the framework
    passes itself, not the user's config, which a plugin must take too)."""
    allowed = accepted_options(cls, num_positional)
    for key in options:
        if key in internal and key not in allowed:  # the plugin's signature, not the user's config
            raise PluginError(f"{_plugin(kind, name, _entry(kind, name))} does not take {key}, which paged_bench "
                              f"passes to every {kind}: take **kwargs in __init__ and pass them on to its base class")  # fmt: skip
        if key not in allowed:
            shown = [o for o in allowed if o not in internal]
            takes = ", ".join(shown) or "no options (a plugin's options are its __init__'s keyword arguments)"
            raise ConfigError(f"{kind}.{key}", options[key], f"{kind} {name!r} takes {takes}")


# the class each schema reads the options of, named as an entry point names it ("module:Class"),
# so that this table imports no backend (torch takes seconds to import)
SCHEMAS: dict[str, type[PluginOptions]] = {
    "paged_bench.core.scheduler.base:Scheduler": SchedulerOptions,
    "paged_bench.core.scheduler.preemptive:PreemptiveScheduler": PreemptiveOptions,
    "paged_bench.core.kv.paged:PagedAllocator": PagedOptions,
    "paged_bench.core.kv.contiguous:ContiguousAllocator": ContiguousOptions,
    "paged_bench.backends.sim:SimBackend": SimOptions,
    "paged_bench.backends.numpy:NumpyBackend": NumpyOptions,
    "paged_bench.backends.torch:TorchBackend": TorchOptions,
}


def schema_of(cls: type) -> type[PluginOptions] | None:
    """The options schema of the nearest of our classes ``cls`` is or derives from, if any: a
    plugin derived from one has the options that class takes checked by its schema, and checks
    its own; a plugin with no such base checks all of its own."""
    for klass in cls.__mro__:
        schema = SCHEMAS.get(f"{klass.__module__}:{klass.__qualname__}")
        if schema is not None:
            return schema
    return None


def checked_options(cls: type, options: Mapping[str, object]) -> PluginOptions | None:
    """``options`` as ``cls``'s schema reads them, checked (ConfigError naming the first bad
    one); None without a schema, or when they leave out one the schema needs: the plugin's
    constructor then says which (an option file that forgot ``max_batch: ${max_batch}``)."""
    schema = schema_of(cls)
    if schema is None:
        return None
    read = {f.name: options[f.name] for f in fields(schema) if f.name in options}
    if any(f.default is MISSING and f.default_factory is MISSING and f.name not in read for f in fields(schema)):
        return None
    return schema(**read)


def create(kind: str, name: str, *args: Any, internal: tuple[str, ...] = (), **options: Any) -> Any:
    """Build plugin ``name`` of ``kind`` from its config options, checked: unknown ones are an
    error, and values our classes take are checked by their schemas.

    ``internal`` names options the framework passes itself, not the user's config."""
    cls = load(kind, name)
    check_option_names(kind, name, cls, len(args), options, internal)
    if (checked := checked_options(cls, options)) is not None:
        checked.verify()
    return construct(kind, name, cls, *args, **options)


def construct(kind: str, name: str, cls: type, *args: Any, **options: Any) -> Any:
    """Build plugin ``name`` of ``kind``, its class ``cls``, from options already checked
    (``create`` checks them; ``run.config`` checks a run's once, where it reads the config)."""
    if left := _abstract_left(cls, _base(kind)):  # in the words Python uses for an interpreted base
        raise PluginError(f"{_plugin(kind, name, _entry(kind, name))} failed to build: TypeError: Can't instantiate "
                          f"abstract class {cls.__name__} with abstract methods {', '.join(left)}")  # fmt: skip
    try:
        obj = cls(*args, **options)
    except PagedBenchError:
        raise
    except Exception as e:  # a plugin's constructor that fails (an abstract method left out, a missing option)
        # a call that does not bind (a missing option) fails here, not in the plugin: say where options come from
        unbound = isinstance(e, TypeError) and e.__traceback__ is not None and e.__traceback__.tb_next is None
        why = f"{one_line(e)} (its options come from its option file, or +{kind}.KEY=VALUE)" if unbound else crash_message(e)
        raise PluginError(f"{_plugin(kind, name, _entry(kind, name))} failed to build: {why}") from e
    if getattr(obj, "name", None) != name:  # errors name a plugin by it: a class left without one, or a copied one
        with contextlib.suppress(AttributeError):
            obj.name = name
    return obj


def _abstract_left(cls: type, base: type) -> list[str]:
    """The methods a compiled ``base`` names abstract (its ``abstract_methods``) that ``cls``
    does not define."""
    return sorted(m for m in getattr(base, "abstract_methods", ()) if getattr(cls, m, None) is getattr(base, m))


def _entry(kind: str, name: str) -> EntryPoint | None:
    return next((ep for ep in _entry_points(kind) if ep.name == name), None)
