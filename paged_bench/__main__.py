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

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig

from paged_bench.cli import catalog, hydra_job, signals, sweep
from paged_bench.cli.hydra_errors import folder_error, hydra_error
from paged_bench.errors import PagedBenchError


@hydra.main(version_base="1.3", config_path="pkg://paged_bench.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_job.run(cfg)


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
