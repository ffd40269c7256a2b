"""``python -m paged_bench.validate [--case NAME]... [--write FILE]``: every published case of
the registry (``conf/validation/*.yaml``) simulated, printed as published / simulated / ratio.

``--write docs/validation.md`` (what ``make validate`` runs) writes the comparison as that
document too; ``--case`` runs the named cases only (a document is written from all of them, so
it is refused with ``--case``); ``--override KEY=VALUE`` adds a ``python -m paged_bench`` override
to every case (what a knob does to the published comparisons, e.g. ``backend.all_reduce=nccl``;
refused with ``--write``: the document is the registry as it stands); ``--list`` prints the
cases and their sources without running them. A bad case file is one line naming the file and
key, exit status 2, before anything runs; a case that fails or runs past ``--case-timeout`` is
reported in its rows and the exit status is 1, the other cases still compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from paged_bench.cli.hydra_job import quiet_stdout
from paged_bench.errors import ConfigError, PagedBenchError, check
from paged_bench.validate.cases import chosen_cases, load_registry
from paged_bench.validate.document import markdown, terminal_table
from paged_bench.validate.simulate import run_case


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paged_bench.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("--case", action="append", default=[], help="run this case only (repeatable)")
    p.add_argument("--write", type=Path, help="also write the comparison as this markdown file (docs/validation.md)")
    p.add_argument("--registry", type=Path, help="a folder of case files (default: conf/validation/)")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="add this python -m paged_bench override to every case (repeatable)",
    )
    p.add_argument("--case-timeout", type=float, default=60.0, help="seconds one case may run (default 60)")
    p.add_argument("--list", action="store_true", help="list the cases and their sources, run nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        check(args.case_timeout > 0, "--case-timeout", args.case_timeout, "seconds > 0")
        check(not (args.case and args.write), "--write", str(args.write),
              "a document of every case: leave out --case to write it")  # fmt: skip
        check(not (args.override and args.write), "--write", str(args.write),
              "a document of the registry as it stands: leave out --override to write it")  # fmt: skip
        for o in args.override:
            check(o.find("=") > 0, "--override", o, "KEY=VALUE, a python -m paged_bench override")
        files = load_registry(args.registry)
        cases = [dataclasses.replace(c, overrides=c.overrides + tuple(args.override))
                 for c in chosen_cases(files, args.case)]  # fmt: skip
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if args.list:
        for c in cases:
            print(f"{c.name}: {c.gpu} {c.model} TP{c.tp}, {len(c.figures)} figure(s); {c.source.citation}")
        return 0
    rows = []
    start = time.perf_counter()
    for case in cases:
        rows += run_case(case, args.case_timeout)
        print(f"{case.name}: done ({time.perf_counter() - start:.1f} s in all)", file=sys.stderr)
    print(terminal_table(rows))
    if args.write:
        try:
            args.write.write_text(markdown(files, rows))
        except OSError as e:
            print(f"error: --write {args.write}: {e.strerror or e}", file=sys.stderr)
            return 1
        print(f"wrote {args.write}", file=sys.stderr)
    return 1 if any(r.error for r in rows) else 0


def cli() -> None:
    try:
        sys.exit(main())
    except BrokenPipeError:  # `--list | head`: the reader went away; nothing left to say
        quiet_stdout()
        sys.exit(0)
    except PagedBenchError as e:  # raised outside the checks above: still one line
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    cli()
