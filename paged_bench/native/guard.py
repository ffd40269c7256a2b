"""The engine core as machine code: which modules ``make install`` compiles with mypyc, and
the guard that runs their source instead whenever the compiled copy cannot be trusted.

mypyc compiles ordinary, type-annotated Python to a C extension beside each module of
``paged_bench/core/`` (``engine.cpython-311-x86_64-linux-gnu.so`` next to ``engine.py``), which Python imports in
preference to the source. The step loop runs about twice as fast so (issue 11). The
source stays the one definition: a checkout without a compiler, or a ``pip install``,
runs the very same code interpreted.

An extension older than its source would silently run yesterday's code, so at import the
whole set is checked: if any compiled module is older than its ``.py`` (an edit, a ``git
pull``) or missing from a build, or ``PAGED_BENCH_INTERPRETED=1`` is set (for a debugger, or to compare), every
module of the set is loaded from source. All or none: compiled modules call each other
directly, past Python's import system, so a mix would run old and new code side by side.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # paged_bench/
CORE = PACKAGE / "core"
# the compiled set is the engine core, whole: every module under paged_bench/core/
MODULES = tuple(
    ".".join(("paged_bench", *path.relative_to(PACKAGE).with_suffix("").parts))
    for path in sorted(CORE.rglob("*.py"))
    if path.name != "__init__.py"
)
SHARED_LIB = "paged_bench._native__mypyc"  # the code itself; each module's extension is a shim into it
INTERPRETED_ENV = "PAGED_BENCH_INTERPRETED"


def source(module: str) -> Path:
    return PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")


def extension(module: str) -> Path | None:
    """The compiled extension of ``module`` that this Python would import, if there is one."""
    base = source(module).with_suffix("")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = base.with_name(base.name + suffix)
        if path.exists():
            return path
    return None


def stale() -> list[str]:
    """The modules of a build that cannot be trusted: its source changed since it was compiled,
    or it has no extension in a build that has others (a module added to ``MODULES`` since),
    or the build's code, the shared library, is gone. [] where nothing was ever compiled."""
    shared = extension(SHARED_LIB)
    found = []
    for module in MODULES:
        ext = extension(module)
        if ext is None and shared is None:  # not compiled, as a checkout without a build
            continue
        if ext is None or shared is None or ext.stat().st_mtime < source(module).stat().st_mtime:
            found.append(module)
    return found


def is_compiled(module: str) -> bool:
    """Whether ``module`` runs as compiled code in this process."""
    file = getattr(sys.modules.get(module), "__file__", None) or ""
    return file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


class _SourceFinder:
    """Finds the compiled set's modules as their ``.py`` files, ahead of their extensions; warns
    once, at the first such import, if that is because the compiled copy is stale."""

    def __init__(self, changed: list[str]) -> None:
        self.changed = changed

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name not in MODULES:
            return None
        if self.changed:
            shown = ", ".join(str(source(m).relative_to(PACKAGE.parent)) for m in self.changed[:3])
            more = f" and {len(self.changed) - 3} more" if len(self.changed) > 3 else ""
            first, self.changed = source(self.changed[0]), []
            # named at the edited file, not at whichever import got here first
            warnings.warn_explicit(
                f"{shown}{more}: the compiled engine core is older than this source (or lacks it), so it runs "
                "interpreted (its step loop about 2x slower); `make install` compiles it again",
                UserWarning,
                str(first),
                0,
            )
        return importlib.util.spec_from_file_location(name, source(name))


def guard() -> None:
    """Load the compiled set from source if asked to (``PAGED_BENCH_INTERPRETED=1``), or if any
    of it is stale. Run once, before any of the set is imported."""
    if any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        return
    asked = os.environ.get(INTERPRETED_ENV, "") not in ("", "0")
    changed = [] if asked else stale()
    if asked or changed:
        sys.meta_path.insert(0, _SourceFinder(changed))
