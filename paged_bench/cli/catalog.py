"""What there is to run: the experiment registry (``conf/experiment/``), the plugins installed
for each kind with the package each comes from, and the config options plugin packages ship.

A plugin package makes its option usable on the command line (``scheduler=sjf``) by shipping
the option's YAML in a package folder named by an entry point in the group
``paged_bench.conf``: ``<folder>/<group>/<option>.yaml``. The CLI registers those files in
Hydra's ConfigStore before composing, which works in every install mode (Hydra's own
``hydra_plugins`` scan does not see editable installs; see docs/ecosystem.md). A file outside
paged_bench's config groups, or named like an option that paged_bench or another package
already has, is left out with a warning. The plugin listing names, per plugin, the options
whose ``name:`` selects it.
"""

from __future__ import annotations

import re
import sys
from contextlib import suppress
from dataclasses import dataclass
from importlib import resources
from importlib.metadata import entry_points

import yaml

from paged_bench.errors import PagedBenchError, one_line
from paged_bench.run import registry

CONF_GROUP = "paged_bench.conf"
_HEADER = re.compile(r"^#\s*@package\s+(\S+)\s*$")
_registered = False


@dataclass(frozen=True)
class Experiment:
    name: str
    question: str  # the file's first comment line: the question it answers
    description: str  # the whole leading comment, without the header and command lines
    sweep: dict[str, str]  # hydra.sweeper.params


def _comment_block(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if not _HEADER.match(line):
            lines.append(line[1:].strip())
    return lines


def _experiment_files():
    root = resources.files("paged_bench.conf").joinpath("experiment")
    return (
        sorted((f for f in root.iterdir() if f.name.endswith(".yaml")), key=lambda f: f.name) if root.is_dir() else []
    )


def experiments() -> list[Experiment]:
    out = []
    for f in _experiment_files():
        text = f.read_text()
        comment = _comment_block(text)
        prose = [line for line in comment if line and not line.startswith("python -m")]
        question = prose[0].removeprefix("Question:").strip() if prose else "(no description)"
        question = question[:1].upper() + question[1:]
        sweep = ((yaml.safe_load(text) or {}).get("hydra") or {}).get("sweeper", {}).get("params") or {}
        out.append(
            Experiment(f.name[: -len(".yaml")], question, " ".join(prose), {str(k): str(v) for k, v in sweep.items()})
        )
    return out


def experiment_description(name: str | None) -> str | None:
    return next((e.description for e in experiments() if e.name == name), None) if name else None


def format_experiments() -> str:
    items = experiments()
    width = max((len(e.name) for e in items), default=0)
    lines = ["Experiments (conf/experiment/), run one with: python -m paged_bench -m +experiment=NAME", ""]
    for e in items:
        lines.append(f"  {e.name:<{width}}  {e.question}")
        if e.sweep:
            lines.append(f"  {'':<{width}}    sweeps " + "; ".join(f"{k}={v}" for k, v in e.sweep.items()))
    return "\n".join(lines)


def _package_header(text: str) -> str | None:
    header = _HEADER.match(text.splitlines()[0]) if text else None
    return header.group(1) if header else None


def _folders(root):
    """The folders under ``root`` that may be config groups (not __pycache__, not hidden)."""
    return (d for d in root.iterdir() if d.is_dir() and not d.name.startswith(("_", ".")))


def packaged_options() -> dict[str, set[str]]:
    """paged_bench's own config groups (its ``conf/`` folders, less Hydra's) and their options."""
    groups = {kind: set() for kind in registry.KINDS}
    for d in _folders(resources.files("paged_bench.conf")):
        if d.name != "hydra":
            groups[d.name] = {f.name[: -len(".yaml")] for f in d.iterdir() if f.name.endswith(".yaml")}
    return groups


def _refusal(group: str, option: str, groups: dict[str, set[str]], owners: dict[tuple[str, str], str]) -> str | None:
    """Why a plugin package's option file is not registered; None when it may be. Hydra would
    take a file in an unknown folder for a group nobody selects, and merge one named like an
    existing option into it: the built-in option would change for every run."""
    if group not in groups:
        return (f"but {group}/ is not one of paged_bench's config groups ({', '.join(sorted(groups))}): "
                "not registered; move it into one of them")  # fmt: skip
    if option in groups[group]:
        owner = f"paged_bench's own option {group}={option}"
    elif (group, option) in owners:
        owner = f"option {group}={option} of plugin package {owners[(group, option)]}"
    else:
        return None
    return f"which {owner} already is: not registered; give it its own name"


def _own_name(group: str, content: object, package: str | None) -> str | None:
    """The ``name:`` an option's content sets for its plugin (under ``<group>:`` in a global one)."""
    body = content.get(group) if isinstance(content, dict) and package == "_global_" else content
    name = body.get("name") if isinstance(body, dict) else None
    return name if isinstance(name, str) else None


def _name_problem(group: str, text: str) -> tuple[str | None, bool]:
    """Why a plugin package's option file of a plugin kind selects no plugin, and whether it is
    registered all the same: it sets no ``name:`` (and extends no other option, whose name it
    would take): not registered; its ``name:`` is no installed plugin (an entry point in a
    group that paged_bench does not read: ``paged_bench.router`` for ``paged_bench.routers``):
    registered, so that selecting it says which group to use."""
    content = yaml.safe_load(text)
    if group not in registry.KINDS or not isinstance(content, dict):
        return None, True
    name = _own_name(group, content, _package_header(text))
    if name is None:
        if content.get("defaults"):
            return None, True
        return f"which sets no name: key: not registered; set name: to its {group} plugin's entry-point name", False
    if name in {p.name for p in registry.discover(group)}:
        return None, True
    return (f"whose name: {name} is no installed {group} plugin: register it in entry-point group "
            f"{registry.KINDS[group][0]}"), True


def _unreadable(e: Exception) -> str:
    """Why an option file could not be read, with the line of a YAML mistake."""
    mark = getattr(e, "problem_mark", None)
    if isinstance(e, yaml.MarkedYAMLError) and mark is not None:
        return f"{e.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return one_line(e)


def register_plugin_configs() -> list[str]:
    """Put the config options that plugin packages ship into Hydra's ConfigStore; returns a
    message per package whose options could not be read and per option file left out (see
    ``_refusal``); the others are registered. Once per process: later calls return nothing."""
    global _registered
    if _registered:
        return []
    _registered = True
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    problems = []
    groups, owners = packaged_options(), {}
    store = ConfigStore.instance()
    # once per entry point, though a package on the path twice (installed, and on PYTHONPATH) lists it twice
    for ep in {(ep.name, ep.value): ep for ep in entry_points(group=CONF_GROUP)}.values():
        package = ep.dist.name if ep.dist is not None else "unknown package"
        try:
            files = [(group.name, f) for group in _folders(resources.files(ep.value)) for f in group.iterdir()
                     if f.name.endswith(".yaml")]  # fmt: skip
            if not files:
                problems.append(f"plugin package {package} ships no option files in {ep.value.replace('.', '/')}/ "
                                "(<group>/<option>.yaml): install them with the package, as package data")  # fmt: skip
            for group, f in files:
                option, where = f.name[: -len(".yaml")], f"{ep.value.replace('.', '/')}/{group}/{f.name}"
                try:
                    text = f.read_text()
                    why, register = _name_problem(group, text)
                    node = OmegaConf.create(text) if register else None
                except Exception as e:  # noqa: BLE001  (one unreadable file: named, the package's others still load)
                    why, register = f"which could not be read: {_unreadable(e)}", False
                if (refused := _refusal(group, option, groups, owners)) is not None:
                    why, register = refused, False
                if why is not None:
                    problems.append(f"plugin package {package} ships {where}, {why}")
                if not register:
                    continue
                store.store(group=group, name=option, node=node, package=_package_header(text), provider=package)
                owners[(group, option)] = package
        except Exception as e:  # noqa: BLE001  (one broken package must not take the others' options away)
            problems.append(f"config options of plugin {ep.name!r} ({ep.value}) from package {package} "
                            f"could not be loaded: {type(e).__name__}: {e}")  # fmt: skip
    return problems


def _options(group: str) -> dict[str, tuple[object, str | None]]:
    """Each option of ``group``, paged_bench's own and plugin-shipped: its content and its
    ``@package``."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    out = {}
    root = resources.files("paged_bench.conf").joinpath(group)
    for f in (f for f in (root.iterdir() if root.is_dir() else ()) if f.name.endswith(".yaml")):
        text = f.read_text()
        out[f.name[: -len(".yaml")]] = (yaml.safe_load(text), _package_header(text))
    store = ConfigStore.instance()
    with suppress(OSError):  # no plugin registered anything in this group
        for name in store.list(group):
            node = store.load(f"{group}/{name}")
            out.setdefault(name[: -len(".yaml")], (OmegaConf.to_container(node.node), node.package))
    return out


def _plugin_of(group: str, option: str, options: dict) -> str | None:
    """The plugin that ``group=<option>`` selects: its ``name:``, or else that of the option it
    extends (the last option in its defaults list, which Hydra merges last)."""
    seen = set()
    while option in options and option not in seen:
        seen.add(option)
        content, package = options[option]
        if not isinstance(content, dict):
            return None
        if (name := _own_name(group, content, package)) is not None:
            return name
        bases = [d.partition("@")[0] for d in content.get("defaults") or () if isinstance(d, str) and d != "_self_"]
        option = bases[-1] if bases else None
    return None


def selecting_options(kind: str) -> dict[str, list[str]]:
    """For each plugin name, the options of group ``kind`` that select it."""
    options = _options(kind)
    out: dict[str, list[str]] = {}
    for option in sorted(options):
        if (name := _plugin_of(kind, option, options)) is not None:
            out.setdefault(name, []).append(option)
    return out


def _plugin_line(kind: str, p: registry.PluginInfo, selected: str, widths: tuple[int, ...]) -> str:
    try:
        registry.load(kind, p.name)
        # .name= keeps the default option's settings (a subclass of its plugin takes them); ~ drops them
        state = "" if selected else (f"  (no config option: select with {kind}.name={p.name}, or with "
                                     f"'~{kind}' +{kind}.name={p.name} for its own defaults)")  # fmt: skip
    except PagedBenchError as e:
        state = f"  BROKEN: {e}"
    w_name, w_target, w_selected = widths
    return f"  {p.name:<{w_name}}  {p.target:<{w_target}}  {selected:<{w_selected}}  from {p.package}{state}"


def format_plugins() -> str:
    """Every discovered plugin, per kind, with its class, the config options that select it,
    its package and whether it loads."""
    problems = register_plugin_configs()
    lines = ["Plugins (entry point groups paged_bench.<kind>s), per kind: name, class, its options, package"]
    for kind, (group, _) in registry.KINDS.items():
        found = registry.discover(kind)
        lines += ["", f"{kind} ({group})"]
        selecting = selecting_options(kind)
        selected = {p.name: ", ".join(f"{kind}={o}" for o in selecting.get(p.name, [])) for p in found}
        columns = ([p.name for p in found], [p.target for p in found], selected.values())
        widths = tuple(max(map(len, column), default=0) for column in columns)
        lines += [_plugin_line(kind, p, selected[p.name], widths) for p in found]
        if not found:
            lines.append("  (none installed)")
    lines += [f"warning: {p}" for p in problems]
    return "\n".join(lines)


def main(what: str) -> int:
    print(format_experiments() if what == "experiments" else format_plugins())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "plugins"))
