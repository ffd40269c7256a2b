"""The resolved config a command would run with, composed in-process (tests, benchmarks,
notebooks, and the commands that take Hydra overrides without being Hydra apps), and the
settings a config may have: a key that is none of them (``+max_bach=4``, a typo Hydra's own
error told the user to add with ``+``) is refused, naming the nearest."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from paged_bench.errors import ConfigError

# an experiment's own section: what its report shows (conf/experiment/*.yaml)
_EXPERIMENT_KEYS = ("report",)


def compose_config(*overrides: str, config_name: str = "config") -> dict[str, Any]:
    """``python -m paged_bench <overrides>``'s config as a plain dict (``config_name="serve"``:
    the server's). Hydra's and OmegaConf's errors propagate for the caller to report."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("paged_bench.conf", version_base="1.3"):
        return OmegaConf.to_container(compose(config_name, overrides=list(overrides)), resolve=True)


@functools.cache
def settings(config_name: str = "config") -> frozenset[str]:
    """The top-level keys of a primary config (``config``: the benchmark's, ``serve``: the
    server's, which includes the benchmark's): their knobs and config groups, and an
    experiment's ``report``. ``server`` is the server's alone: a plain run does not take it."""
    from importlib import resources

    import yaml

    keys = set(_EXPERIMENT_KEYS)
    primary = yaml.safe_load(resources.files("paged_bench.conf").joinpath(f"{config_name}.yaml").read_text())
    for default in primary.pop("defaults", []):
        if isinstance(default, str) and default != "_self_":  # another primary config, included whole
            keys |= settings(default)
        elif isinstance(default, dict) and not next(iter(default)).startswith("override "):
            keys.add(next(iter(default)))
    return frozenset(keys | set(primary) - {"hydra"})


def check_settings(cfg: Mapping[str, Any], config_name: str = "config") -> None:
    """Every top-level key of ``cfg`` is one of ``settings(config_name)`` (Hydra's own
    ``hydra`` aside), or of the server's when ``cfg``'s target starts it."""
    # a run that starts our server (target=served) composes the server's config too
    known = settings("serve" if (cfg.get("target") or {}).get("spawn") else config_name)
    for key in (k for k in cfg if k != "hydra" and k not in known):
        raise unknown_key(key, cfg[key], known, "paged_bench's config")


def _servers_section(key: str, value: Any) -> ConfigError:
    """``key`` is in the server's section, on a run that starts no server: not a typo."""
    return ConfigError(key, value, "the server's section (python -m paged_bench.serve, or target=served, which "
                       "starts one); a run aims at a server with target=openai target.base_url=URL")  # fmt: skip


def unknown_key(key: str, value: Any, known: Iterable[str], what: str, more: str = "", at: int = -1) -> ConfigError:
    """``key``'s segment ``at`` is none of ``known`` (the keys of ``what``, the part of the
    config that segment would be in): the error names the nearest."""
    segments = key.split(".")
    at %= len(segments)
    if at == 0 and segments[0] in settings("serve") - set(known):  # not a typo: the server's section
        return _servers_section(key, value)
    known = sorted(k for k in known if k != "hydra")
    near = difflib.get_close_matches(segments[at], known, n=1)
    hint = f" (did you mean {'.'.join([*segments[:at], near[0], *segments[at + 1 :]])}?)" if near else ""
    return ConfigError(key, value, f"not a key of {what}{hint}; its keys are {', '.join(known)}{more}")


def unknown_override(e: Exception) -> ConfigError | None:
    """Hydra's refusal of an override whose key the config lacks (``max_bach=4``: "not in
    struct", with the advice to add it with ``+``, which for a typo runs with the setting meant
    unchanged), as the error naming the nearest key; None for any other error."""
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause = e.__cause__
    appended = re.search(r"use \+(\S+?)=(.*)$", str(e), re.MULTILINE)
    if not (isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and appended
            and isinstance(cause.parent_node, DictConfig)):  # fmt: skip
        return None
    key, value = appended.groups()
    at = _depth(cause.parent_node)  # the segment the config lacks (server.port=1: server)
    if at == 0:
        return unknown_key(key, _typed(value), list(cause.parent_node), "paged_bench's config", at=0)
    segments = key.split(".")
    others = _options_taking(segments[0], segments[1]) if at == 1 else []
    # an option of another built-in choice of the group is not this one's; a plugin option its
    # file leaves out still goes in with +
    more = (f"; {segments[1]} is an option of {', '.join(f'{segments[0]}={o}' for o in others)}" if others
            else f"; a plugin option its file leaves out is added with +{key}={value}")  # fmt: skip
    return unknown_key(key, _typed(value), list(cause.parent_node), f"the {'.'.join(segments[:at])} section", more, at)


def _options_taking(group: str, option: str) -> list[str]:
    """The built-in choices of config group ``group`` whose file sets ``option``
    (``backend``, ``tensor_parallel_size``: sim, torch)."""
    from importlib import resources

    import yaml

    folder = resources.files("paged_bench.conf").joinpath(group)
    if not folder.is_dir():
        return []
    files = sorted(f for f in folder.iterdir() if f.name.endswith(".yaml"))
    return [f.name[:-5] for f in files if option in (yaml.safe_load(f.read_text()) or {})]


def _depth(node: Any) -> int:
    """How many sections down the config's top level ``node`` is (0: the top level)."""
    depth = 0
    while (node := node._get_parent()) is not None:
        depth += 1
    return depth


def _typed(text: str) -> object:
    """A command line's value as Hydra reads it (``4`` an int, ``x`` a string)."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
