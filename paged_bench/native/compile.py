"""Compile the engine core (``paged_bench.native.guard.MODULES``) with mypyc, in place.

``make install`` runs it after installing the package (mypy, which carries mypyc, is a dev
dependency); it does nothing when every compiled module is newer than its source. Run by
hand from the repository root:

    PAGED_BENCH_INTERPRETED=1 .venv/bin/python -m paged_bench.native.compile [--force]

Without mypyc or a C compiler, or when a module does not type-check (compiled code enforces
its annotations at run time, so mypyc refuses it), it says why and leaves the package
interpreted: the same code runs, slower, and every import warns that the core is stale until a
build succeeds (``tests/test_native.py`` fails meanwhile, so CI does not pass a broken build).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import sysconfig
import time

from paged_bench.native.guard import MODULES, PACKAGE, SHARED_LIB, extension, source, stale

BUILD_DIR = PACKAGE.parent / "build" / "native"
# mypy checks the compiled modules only: what they import is read for its types, not judged
MYPY_FLAGS = ["--ignore-missing-imports", "--follow-imports=silent", "--cache-dir", str(BUILD_DIR / "mypy_cache")]


def up_to_date() -> bool:
    return extension(SHARED_LIB) is not None and not stale()


def missing_tools() -> str | None:
    """Why this machine cannot compile, or None."""
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed (pip install mypy)"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} is not on PATH)"
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        return "Python's C headers (Python.h) are not installed"
    return None


def build() -> None:
    from mypyc.build import mypycify
    from setuptools import setup

    paths = [str(source(m).relative_to(PACKAGE.parent)) for m in MODULES]
    os.chdir(PACKAGE.parent)  # mypyc names modules by their paths from the repository root
    extensions = mypycify([*MYPY_FLAGS, *paths], opt_level="3", group_name="paged_bench._native",
                          target_dir=str(BUILD_DIR / "c"))  # fmt: skip
    setup(
        name="paged_bench_native",
        ext_modules=extensions,
        script_args=["--quiet", "build_ext", "--inplace", "--build-temp", str(BUILD_DIR / "obj")],
    )
    # setuptools skips an extension whose C is unchanged (an edited comment): its file is
    # still the source's compiled copy, and must look it
    now = time.time()
    for module in (*MODULES, SHARED_LIB):
        os.utime(extension(module), (now, now))  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="compile even when up to date")
    args = parser.parse_args(argv)
    if up_to_date() and not args.force:
        return 0
    if (why := missing_tools()) is not None:
        print(f"paged_bench: the engine core stays interpreted (about 2x slower in the step loop): {why}")
        return 0
    started = time.perf_counter()
    print(f"paged_bench: compiling the engine core with mypyc ({len(MODULES)} modules)...", flush=True)
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            build()
    except SystemExit as e:  # mypy's type errors (printed on stdout), or the C compiler's
        print(log.getvalue(), end="")
        why = e.code if isinstance(e.code, str) else "the errors above"  # setuptools' message, or mypy's exit status
        print(f"paged_bench: compiling the engine core failed ({why}); it runs interpreted until they are fixed and "
              "make install compiles it", file=sys.stderr)  # fmt: skip
        return 0
    print(f"paged_bench: compiled in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
