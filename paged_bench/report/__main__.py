"""``python -m paged_bench.report PATH... | --experiment NAME...``: tables and plots of finished runs.

PATH is a run directory, a sweep directory, or any folder of runs; ``--experiment NAME`` takes
the latest sweep of that MLflow experiment (from the same store the runs were logged to). Each
source gets its folder of files (``table.csv``, ``table.md``, ``report.md``, PNGs); the
markdown is printed too. ``--into FILE`` replaces the part of FILE between the lines
``<!-- report:start -->`` and ``<!-- report:end -->`` (how the README's results are made).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from paged_bench.cli.catalog import experiment_description
from paged_bench.errors import ConfigError, PagedBenchError, check, one_line
from paged_bench.report.document import build_report, unknown_metrics
from paged_bench.report.load import REPORT_DIR, find_runs
from paged_bench.report.mlflow_source import fetch_experiment
from paged_bench.report.tables import METRICS
from paged_bench.results.whole_files import folder_name
from paged_bench.tracking import store

START, END = "<!-- report:start -->", "<!-- report:end -->"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paged_bench.report", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", type=Path, help="run or sweep directories")
    p.add_argument("--experiment", action="append", default=[], help="an MLflow experiment (repeatable)")
    p.add_argument("--out", type=Path, help="where the files go (default: PATH/report, runs/reports/NAME)")
    p.add_argument("--md", type=Path, help="also write all sections to this markdown file, its links relative to it")
    p.add_argument("--into", type=Path, help=f"write all sections into this file between {START} and {END}")
    p.add_argument("--metrics", help="comma-separated summary keys (default: the experiment's report.metrics)")
    p.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else ./runs/mlflow.db)")
    p.add_argument("--no-plots", action="store_true")
    return p


def _report(runs, out: Path, name: str, args) -> str:
    metrics = _metrics(args.metrics, runs)
    title = runs and (runs[0].config.get("experiment_name") or name)
    rep = build_report(runs, out, title=title, description=experiment_description(title), metrics=metrics,
                       plots=not args.no_plots)  # fmt: skip
    print(f"report of {len(runs)} run(s) -> {out}", file=sys.stderr)
    target = args.into or args.md
    return rep.markdown_at(target.resolve().parent if target else rep.out_dir)


def _metrics(option: str | None, runs) -> list[str] | None:
    """``--metrics``, each a figure the report knows or one of these runs has; a typo is an
    error, not a column that silently never shows."""
    if not option:
        return None
    wanted = [m.strip() for m in option.split(",") if m.strip()]
    unknown = unknown_metrics(wanted, runs)
    if unknown or not wanted:
        raise ConfigError("--metrics", option, f"summary keys such as {', '.join(list(METRICS)[:6])}, ... "
                                               f"({', '.join(unknown) or 'none given'}: not a figure of these runs)")  # fmt: skip
    return wanted


def _fetch(name: str, dest: Path, tracking_uri: str | None) -> list:
    """The runs of experiment ``name``; a store that is down or refuses is one line, as in ``sync``."""
    store.check_uri(tracking_uri, "--tracking-uri")
    try:
        return fetch_experiment(name, dest, tracking_uri)
    except PagedBenchError:
        raise
    except Exception as e:
        raise PagedBenchError(f"report failed: {one_line(e)}") from e


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name-2``, ``name-3``...: two sources of one folder name get two folders."""
    unique, n = name, 1
    while unique in taken:
        n += 1
        unique = f"{name}-{n}"
    taken.add(unique)
    return unique


def write_into(path: Path, markdown: str) -> None:
    """Replace what stands between the report markers of ``path``; the rest stays as it is."""
    text = path.read_text() if path.exists() else ""
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not (start and end):
        raise PagedBenchError(f"{path} has no {START} ... {END} section to write the report into")
    path.write_text(f"{head}{START}\n{markdown}{END}{tail}")


def check_destinations(args: argparse.Namespace) -> None:
    """``--out``, ``--md`` and ``--into`` can be written, found before any report is built (a
    file named as a folder, or the reverse, failed once the report folder was written)."""
    for flag, path, folder in (("--out", args.out, True), ("--md", args.md, False), ("--into", args.into, False)):
        if path is None:
            continue
        if path.exists():
            check(path.is_dir() == folder, flag, str(path), "a folder (this is a file)" if folder
                  else "a file (this is a folder)")  # fmt: skip
        above = next((p for p in path.parents if p.exists()), path.parent)
        check(above.is_dir(), flag, str(path), f"a path in a folder ({above} is a file)")


def _os_error(e: OSError) -> str:
    """An OSError as one line that names the path it failed on."""
    where = e.filename if e.filename is not None else "a report file"
    return f"error: could not write {where}: {e.strerror or one_line(e)}"


def _write_markdown(args: argparse.Namespace, markdown: str) -> None:
    if args.into:
        write_into(args.into, markdown)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(markdown)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.paths and not args.experiment:
        _parser().error("give a run or sweep directory, or --experiment NAME")
    several = len(args.paths) + len(args.experiment) > 1
    sections, taken = [], set()
    try:
        check_destinations(args)
        for path in args.paths:
            runs = find_runs(path)
            if not runs:
                raise PagedBenchError(f"no runs found in {path} (a run directory holds summary.json or run_info.json)")
            out = path / REPORT_DIR
            if args.out:
                out = args.out / _unique(path.resolve().name, taken) if several else args.out
            sections.append(_report(runs, out, path.resolve().name, args))
        for name in args.experiment:
            with tempfile.TemporaryDirectory() as tmp:
                runs = _fetch(name, Path(tmp), args.tracking_uri)
                folder = _unique(folder_name(name), taken)
                out = (args.out / folder if several else args.out) if args.out else Path("runs", "reports", folder)
                sections.append(_report(runs, out, name, args))
    except PagedBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a folder that could not be made or written (permissions, a full disk)
        print(_os_error(e), file=sys.stderr)
        return 1
    markdown = "\n".join(sections)  # each ends with a newline: a blank line between them
    try:
        _write_markdown(args, markdown)
    except PagedBenchError as e:
        print(markdown)  # the report is built: it is not lost with the file it was to go into
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        print(markdown)
        print(_os_error(e), file=sys.stderr)
        return 1
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
