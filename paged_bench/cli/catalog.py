"""What there is to run: the experiment registry (``conf/experiment/``), the plugins installed
for each kind with the package each comes from, and the config options plugin packages ship.

A plugin package makes its option usable on the command line (``scheduler=sjf``) by shipping
the option's YAML in a package folder named by an entry point in the group
``paged_bench.conf``: ``<folder>/<group>/<option>.yaml``. The CLI registers those files in
Hydra's ConfigStore before composing, which works in every install mode (Hydra's own
``hydra_plugins`` scan does not see editable installs; see docs/ecosystem.md).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import resources
from importlib.metadata import entry_points

import yaml

from paged_bench import registry
from paged_bench.errors import PagedBenchError

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


def register_plugin_configs() -> list[str]:
    """Put the config options that plugin packages ship into Hydra's ConfigStore; returns a
    message per package whose options could not be read (the others are registered)."""
    global _registered
    if _registered:
        return []
    _registered = True
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    problems = []
    store = ConfigStore.instance()
    for ep in entry_points(group=CONF_GROUP):
        package = ep.dist.name if ep.dist is not None else "unknown package"
        try:
            root = resources.files(ep.value)
            for group in (d for d in root.iterdir() if d.is_dir() and not d.name.startswith(("_", "."))):
                for f in (f for f in group.iterdir() if f.name.endswith(".yaml")):
                    text = f.read_text()
                    header = _HEADER.match(text.splitlines()[0]) if text else None
                    store.store(group=group.name, name=f.name[: -len(".yaml")], node=OmegaConf.create(text),
                                package=header.group(1) if header else None, provider=package)  # fmt: skip
        except Exception as e:  # noqa: BLE001  (one broken package must not take the others' options away)
            problems.append(f"config options of plugin {ep.name!r} ({ep.value}) from package {package} "
                            f"could not be loaded: {type(e).__name__}: {e}")  # fmt: skip
    return problems


def config_options(group: str) -> set[str]:
    """The options ``group=<option>`` accepts: built-in YAML files and plugin-shipped ones."""
    from hydra.core.config_store import ConfigStore

    root = resources.files("paged_bench.conf").joinpath(group)
    names = {f.name[: -len(".yaml")] for f in root.iterdir() if f.name.endswith(".yaml")} if root.is_dir() else set()
    try:
        names |= {n[: -len(".yaml")] for n in ConfigStore.instance().list(group)}
    except OSError:  # no plugin registered anything in this group
        pass
    return names


def format_plugins() -> str:
    """Every discovered plugin, per kind, with its class, its package and whether it loads."""
    problems = register_plugin_configs()
    lines = ["Plugins (entry point groups paged_bench.<kind>s), per kind:"]
    for kind, (group, _) in registry.KINDS.items():
        found = registry.discover(kind)
        lines += ["", f"{kind} ({group})"]
        options = config_options(kind)
        width = max((len(p.name) for p in found), default=0)
        target_width = max((len(p.target) for p in found), default=0)
        for p in found:
            try:
                registry.load(kind, p.name)
                state = "" if p.name in options else f"  (no config option: select with {kind}.name={p.name})"
            except PagedBenchError as e:
                state = f"  BROKEN: {e}"
            lines.append(f"  {p.name:<{width}}  {p.target:<{target_width}}  from {p.package}{state}")
        if not found:
            lines.append("  (none installed)")
    lines += [f"warning: {p}" for p in problems]
    return "\n".join(lines)


def main(what: str) -> int:
    print(format_experiments() if what == "experiments" else format_plugins())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "plugins"))
