"""Hydra's refusals and failed folders as one line each: what every Hydra entry point
(``python -m paged_bench``, ``paged_bench.serve``, ``paged_bench.calibration.calibrate``) prints
instead of Hydra's report or a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import hydra
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException

from paged_bench.results.whole_files import cannot_write
from paged_bench.run.compose import unknown_override


def _one_line(e: HydraException) -> str:
    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in e.missing_cfg_file:
        group, _, option = e.missing_cfg_file.rpartition("/")
        # Hydra lists none for an option of a list (cluster=[a,b]): they are looked up here
        options = e.options or _group_options(group)
        return f"{group}={option} is not allowed: one of {', '.join(options) or '(none available)'}"
    if (error := unknown_override(e)) is not None:
        return str(error)
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if e.__cause__ is not None:
        lines.append(str(e.__cause__).splitlines()[0])
    return " ".join(lines[:3])


def _group_options(group: str) -> list[str]:
    """The options of config group ``group``: the packaged ones and any plugin's."""
    try:
        GlobalHydra.instance().clear()  # the failed command's, if it is still there
        with initialize_config_module("paged_bench.conf", version_base="1.3"):
            return sorted(GlobalHydra.instance().config_loader().get_group_options(group))
    except Exception:  # noqa: BLE001  (only an error message's detail is at stake)
        return []


_HYDRA = Path(hydra.__file__).parent


def _raised_in_hydra(e: BaseException) -> bool:
    """Whether Hydra's own code raised ``e`` (a command line it refuses), not a job's."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and Path(tb.tb_frame.f_code.co_filename).is_relative_to(_HYDRA)


def _group_option_line(e: ValueError | TypeError) -> str:
    """A ValueError or TypeError inside Hydra's defaults list: a group override given values
    that are not option names (``router=[1,2]``, ``cluster=null``: "Config group override must
    be a string or a list. Got NoneType", naming no group). The group is the one Hydra was
    expanding, if it is known."""
    tb, group, options = e.__traceback__, None, None
    while tb is not None:  # the innermost frame that holds the group default (or override) being read
        default, override = tb.tb_frame.f_locals.get("d"), tb.tb_frame.f_locals.get("override")
        if isinstance(getattr(default, "group", None), str) and hasattr(default, "get_options"):
            group, options = default.group, default.get_options()
        elif isinstance(getattr(override, "key_or_group", None), str) and hasattr(override, "value"):
            group, options = override.key_or_group, override.value()
        tb = tb.tb_next
    if group is None:
        if isinstance(e, ValueError):
            return str(e).strip().splitlines()[0]
        return f"a config group takes option names, e.g. router=round_robin ({type(e).__name__}: {e})"
    shown = f"[{', '.join(map(str, options))}]" if isinstance(options, list) else "null" if options is None else options
    names = ", ".join(_group_options(group)) or "(none available)"
    return f"{group}={shown} is not allowed: an option name, one of {names}"


def hydra_error(e: BaseException) -> str | None:
    """The one line for a command line Hydra refused: its own exception, or a ValueError
    (``workload=null``, ``--cfg`` with ``-m``) or TypeError (``router=[1,2]``) raised in its
    code; None when ``e`` is not Hydra's (a job's bug keeps its traceback)."""
    if isinstance(e, HydraException):
        return _one_line(e)
    if not (isinstance(e, (ValueError, TypeError)) and _raised_in_hydra(e)):
        return None
    return _group_option_line(e)


def folder_error(e: OSError) -> str | None:
    """The one line for a run's or a sweep's folder that could not be made or written: by Hydra
    (the folder, its ``.hydra/`` files) or in it by the sweep (under a file, a full disk). None
    for an error from elsewhere, a bug's: it keeps its traceback (a job reports its own folder's)."""
    frames = _frames(e)
    if not (_innermost_is_hydra(frames) or _names_a_hydra_folder(e)):
        return None
    return cannot_write(e, _hydra_path(frames))


def _frames(e: BaseException) -> list:
    frames, tb = [], e.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _innermost_is_hydra(frames: list) -> bool:
    """Whether the innermost frame of Hydra's or of this package's is Hydra's (pathlib's and
    io's frames lie below it)."""
    ours = Path(__file__).parent.parent
    files = (Path(f.f_code.co_filename) for f in reversed(frames))
    owner = next((f for f in files if f.is_relative_to(_HYDRA) or f.is_relative_to(ours)), None)
    return owner is not None and owner.is_relative_to(_HYDRA)


def _hydra_path(frames: list) -> str | None:
    """What Hydra was writing when a write failed with no path in its error (a full disk): its
    ``_save_config(cfg, filename, output_dir)``'s file, else the folder of the job or the sweep
    it was writing in."""
    for frame in reversed(frames):
        if not Path(frame.f_code.co_filename).is_relative_to(_HYDRA):
            continue
        local = frame.f_locals
        if local.get("output_dir") is not None:
            name = local.get("filename")
            return os.path.join(str(local["output_dir"]), name if isinstance(name, str) else "")
        if local.get("sweep_dir") is not None:
            return str(local["sweep_dir"])
    return None


def _names_a_hydra_folder(e: OSError) -> bool:
    """Whether ``e`` names a path in the folder of the job or the sweep Hydra is running (while
    it still knows them: it forgets its job's as the job ends)."""
    if e.filename is None or isinstance(e.filename, int) or not HydraConfig.initialized():
        return False
    hc = HydraConfig.get()
    folders = [os.path.abspath(str(f)) for f in (hc.runtime.get("output_dir"), hc.sweep.dir) if f]
    path = os.path.abspath(os.fsdecode(e.filename))
    return any(os.path.commonpath([path, folder]) == folder for folder in folders)
