"""``python -m paged_bench [overrides]``: one benchmark run (or a sweep with ``-m``), by Hydra.

Thin on purpose: Hydra composes the config and ``cli.hydra_job.run`` does the job (build and run
the engine through ``app.run_job``, write the run's files, log it to MLflow). ``--experiments``
and ``--plugins`` list the experiment registry and the installed plugins. A bad value is one
line on stderr and a non-zero exit, and so is a run folder that cannot be written (under a
file, a full disk); a run that stops early still writes and logs what it measured; a sweep with
failed jobs exits non-zero once everything is logged.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import warnings
from contextlib import suppress
from pathlib import Path

import hydra
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig

from paged_bench.cli import catalog, hydra_job, signals, sweep
from paged_bench.errors import PagedBenchError
from paged_bench.results.whole_files import cannot_write
from paged_bench.run.compose import unknown_override


@hydra.main(version_base="1.3", config_path="pkg://paged_bench.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_job.run(cfg)


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
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

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
    code; None when ``e`` is not Hydra's (a job's bug keeps its traceback). Shared by every
    Hydra entry point (this one, ``serve``, ``model.calibrate``)."""
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
    ours = Path(__file__).parent
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
    from hydra.core.hydra_config import HydraConfig

    if e.filename is None or isinstance(e.filename, int) or not HydraConfig.initialized():
        return False
    hc = HydraConfig.get()
    folders = [os.path.abspath(str(f)) for f in (hc.runtime.get("output_dir"), hc.sweep.dir) if f]
    path = os.path.abspath(os.fsdecode(e.filename))
    return any(os.path.commonpath([path, folder]) == folder for folder in folders)


def _multirun_after_overrides(args: list[str]) -> str | None:
    """``-m`` (``--multirun``) after an override, which Hydra's parser takes for an unknown
    argument (eight lines of usage); None when it is where it belongs, or absent."""
    first = next((i for i, arg in enumerate(args) if "=" in arg and not arg.startswith("-")), len(args))
    return next((arg for arg in args[first + 1 :] if arg in ("-m", "--multirun")), None)


def cli() -> None:
    """The command. Hydra's own composition errors (an unknown option, a malformed override)
    become one line too, unless HYDRA_FULL_ERROR=1 asks for Hydra's full report. A sweep that
    ends by an exception or a signal still gets its summary and its MLflow parent run closed;
    SIGTERM and SIGHUP stop it as Ctrl-C does (``cli.signals``)."""
    if sys.argv[1:2] in (["--experiments"], ["--plugins"]):
        if len(sys.argv) > 2:  # else Hydra would print its usage and "unrecognized arguments"
            print(f"error: {sys.argv[1]} takes nothing after it (got {' '.join(sys.argv[2:])})", file=sys.stderr)
            sys.exit(2)
        sys.exit(catalog.main(sys.argv[1][2:]))
    if (misplaced := _multirun_after_overrides(sys.argv[1:])) is not None:
        print(f"error: {misplaced} must come before the overrides: python -m paged_bench {misplaced} KEY=VALUE ...",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    for problem in catalog.register_plugin_configs():
        print(f"warning: {problem}", file=sys.stderr)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # hydra/launcher=ray: nothing talks to outside hosts
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # make Hydra raise instead of printing its report
    signals.install(signals.HANDLED)
    # a sweep folder under a file (or in no folder at all): the sweep's start fails on it first,
    # which Hydra only warns of; its own mkdir of the same folder fails next, reported in one line
    warnings.filterwarnings("ignore", r"Callback SweepCallback\.on_multirun_start raised "
                                      r"(NotADirectory|FileNotFound)Error")  # fmt: skip
    from paged_bench.tracking import uploader

    uploader.prestart(sys.argv[1:])  # mlflow's import overlaps the run
    try:
        main()
    except BrokenPipeError:  # `--help | head`: the reader went away; nothing left to say
        hydra_job.quiet_stdout()
        sys.exit(0)
    # Hydra refuses some command lines with a ValueError or a TypeError; an OSError is a run's or
    # a sweep's folder it could not make or write (under a file, a full disk)
    except (HydraException, ValueError, TypeError, OSError) as e:
        with suppress(OSError):  # where the sweep's folder is the one that failed: report the first error
            sweep.finish("FAILED")
        # (Hydra's MissingConfigException is an IOError too: a config, not a folder)
        folder = isinstance(e, OSError) and not isinstance(e, HydraException)
        line, status = (folder_error(e), 1) if folder else (hydra_error(e), 2)
        if full_error or line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(status)
    except PagedBenchError as e:  # a sweep refused before any job ran
        sweep.finish("FAILED")
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sweep.finish("KILLED")
        print(signals.stopped_by(), file=sys.stderr)
        sys.exit(signals.exit_status())
    except SystemExit:  # Hydra's --help and friends end here; their output may still be buffered
        _flush_stdout()
        raise
    except BaseException:
        sweep.finish("FAILED")
        raise
    if signals.received():  # it came as the sweep was being closed, after its last job ended
        print(f"note: {signal.Signals(signals.received()).name} came after the sweep's last job had ended: the sweep "
              "was closed as it ended, nothing was cut short", file=sys.stderr)  # fmt: skip
    failed = sweep.failed_jobs()
    if failed:
        print(f"error: {failed[0]} of {failed[1]} sweep jobs did not finish (see the table above)", file=sys.stderr)
        sys.exit(1)


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        hydra_job.quiet_stdout()


if __name__ == "__main__":
    try:
        cli()
    finally:
        # everything still held is the OS's to take back as the process ends; the interpreter's
        # last collection would walk each of the imports' objects first: 70 ms of a 0.9 s run
        gc.freeze()
