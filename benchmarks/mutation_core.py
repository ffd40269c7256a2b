"""A mutation check of the engine core: small faults put into ``paged_bench/core/``, one at a
time, each run against a chosen set of tests that must fail ("kill" it). A fault no test
notices is a missing test, or code that cannot change behaviour (an equivalent mutant).

Mutants, made from each module's ``ast`` and spliced into its text (formatting kept):

    delete    a statement replaced by ``pass`` (a whole ``if``/``for``/``def`` too)
    compare   < <=, > >=, == !=, is / is not, in / not in, each flipped
    reversed  ``reversed(x)`` -> ``x``
    boolop    ``and`` <-> ``or``
    arith     ``+`` <-> ``-`` (and ``+=`` <-> ``-=``)
    number    an integer constant +1 and -1
    bool      ``True`` <-> ``False``
    not       ``not x`` -> ``x``

Left alone, as no test could or should see them: docstrings and other bare strings, imports,
``pass``, ``assert`` (type narrowing for mypyc), annotations and annotation-only statements,
``__all__`` and ``__slots__``, ``if TYPE_CHECKING:`` blocks, ``Protocol`` classes (types whose
methods never run), decorators (mypyc hints, dataclass shapes), logging and ``warnings.warn`` calls, and inside a ``raise`` or an f-string (error
messages) nothing but the deletion of the whole ``raise``. Strings are never mutated.

How it runs: ``paged_bench/`` and ``tests/`` are copied to a temporary folder (its compiled
extensions left out, so the core runs interpreted; ``PAGED_BENCH_INTERPRETED=1`` too) and a
mutant is written there, never in the working tree, which an interrupt therefore cannot leave
mutated. A first run of the tests, traced, records which tests execute each line of the core
(lines run at import count for every test); each mutant then runs only the tests that execute
its lines (none: it survives, "no test runs it"), in a process forked from this one after it
imported the tests' third-party modules (pytest, hypothesis, hydra: seconds a run otherwise),
stopping at the first failure. A run that outlasts ``--timeout`` (default: three times what the
same tests took unmutated, plus 5 s) counts apart, as "timed out" (an endless loop: killed).
Hypothesis runs derandomized, with no example database, so a run repeats.

``mutation_equivalent.toml`` lists mutants shown equivalent, by module, enclosing function,
line of code and mutation (line numbers move as the core is edited), each with its reason; a
mutant found equivalent goes there, a redundant line is better deleted. They are counted, not run
(``--check-equivalent`` runs them too: one killed is listed wrongly). Run from the repository
root:

    .venv/bin/python benchmarks/mutation_core.py                      # every mutant: long
    .venv/bin/python benchmarks/mutation_core.py --sample 40 --seed 1  # 40 a module, minutes
    .venv/bin/python benchmarks/mutation_core.py --modules scheduler/base.py --list

Exit status 1 if any mutant tried survived.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # no BLAS threads in a process that forks
os.environ["PAGED_BENCH_INTERPRETED"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_mutants import Mutant, mutants_of

ROOT = Path(__file__).resolve().parents[1]
CORE = Path("paged_bench/core")
# fast tests of the core's behaviour (a few seconds interpreted), tests/test_core_*.py first
TESTS = ("tests/test_core_*.py", "tests/test_schedulers.py", "tests/test_allocators.py", "tests/test_block_pool.py",
         "tests/test_step_contract.py", "tests/test_kv_accounting.py", "tests/test_deferred_hashing.py",
         "tests/test_engine.py", "tests/test_arrivals.py", "tests/test_plugin_faults.py", "tests/test_cluster.py",
         "tests/test_properties.py", "tests/test_engine_behaviours.py")  # fmt: skip
# stop at the first failure; no plugin the core's tests do not use (each loads in every run)
PYTEST_ARGS = ("-q", "-x", "--no-header", "-W", "ignore", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:schemathesis",
               "-p", "no:xdist", "-p", "no:xdist.looponfail", "-p", "no:unraisableexception")  # fmt: skip


# -- running the tests in a forked child ------------------------------------------------------


class Coverage:
    """A pytest plugin recording how long each test takes and (``traced``) which tests execute
    each line of the core."""

    def __init__(self, core: str, traced: bool) -> None:
        self.core, self.traced, self.current, self.lines = core, traced, "", defaultdict(set)
        self.order: list[str] = []  # node ids, in run order
        self.durations: dict[str, float] = defaultdict(float)

    def trace(self, frame, event, arg):
        return self.local if frame.f_code.co_filename.startswith(self.core) else None

    def local(self, frame, event, arg):
        if event == "line":
            self.lines[(frame.f_code.co_filename[len(self.core) :], frame.f_lineno)].add(self.current)
        return self.local

    def pytest_runtest_logstart(self, nodeid, location):
        self.current = nodeid
        self.order.append(nodeid)

    def pytest_runtest_logreport(self, report):
        self.durations[report.nodeid] += report.duration

    def pytest_runtest_logfinish(self, nodeid, location):
        self.current = ""


def _hypothesis_profile() -> None:
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return
    settings.register_profile("mutation", database=None, derandomize=True, deadline=None,
                              suppress_health_check=list(HealthCheck))  # fmt: skip
    settings.load_profile("mutation")


def fork_tests(copy: Path, args: list[str], log: Path, plugin: object = None, save: Path | None = None) -> int:
    """Run pytest on ``args`` in ``copy`` in a forked child (its own process group); its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 98
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setpgid(0, 0)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(copy)
        sys.path.insert(0, str(copy))
        sys.dont_write_bytecode = plugin is None  # the first runs leave the tests' bytecode
        assert "paged_bench" not in sys.modules, "this process must not import paged_bench: forks would share it"
        _hypothesis_profile()
        import pytest

        if isinstance(plugin, Coverage) and plugin.traced:
            sys.settrace(plugin.trace)
        code = pytest.main([*PYTEST_ARGS, *args], plugins=[plugin] if plugin else [])
        sys.settrace(None)
        if isinstance(plugin, Coverage) and save is not None:
            third_party = [m for m in sys.modules if not m.startswith(("paged_bench", "tests", "conftest", "__"))]
            lines = {f"{f}:{n}": sorted(ids) for (f, n), ids in plugin.lines.items()}
            save.write_text(json.dumps({"lines": lines, "order": plugin.order, "durations": plugin.durations,
                                        "modules": third_party}))  # fmt: skip
    except BaseException:  # noqa: BLE001 - the child's last words go to its log, whatever ended it
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))


def wait(pid: int, timeout: float | None) -> int | None:
    """The child's exit code (negative: a signal), or None when it ran past ``timeout`` (killed)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if deadline is not None and time.monotonic() > deadline:
                kill(pid)
                return None
            time.sleep(0.01)
    except KeyboardInterrupt:  # the child is in a process group of its own: Ctrl-C does not reach it
        kill(pid)
        raise


def kill(pid: int) -> None:
    """End a child this script forked, and whatever it started (its process group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def preimport(modules: list[str]) -> None:
    """Import the tests' third-party modules here, once, so that each forked run finds them."""
    for name in modules:
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001, S110 - a module that cannot be imported alone is imported by the run
            pass


# -- the check ------------------------------------------------------------------------------


def copy_tree(dest: Path) -> None:
    """``paged_bench/`` and ``tests/`` without compiled extensions or bytecode, and the pytest config."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", ".hypothesis")
    for name in ("paged_bench", "tests"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")


def choose(mutants: list[Mutant], args: argparse.Namespace) -> list[Mutant]:
    if args.lines:  # a run's timed-out mutants again, say, with a longer --timeout
        mutants = [m for m in mutants if m.where in args.lines]
    if args.sample is not None and mutants:
        mutants = sorted(random.Random(f"{args.seed}:{mutants[0].path}").sample(mutants, min(args.sample, len(mutants))),
                         key=lambda m: (m.line, m.start))  # fmt: skip
    return mutants[: args.limit] if args.limit is not None else mutants


def tests_for(m: Mutant, cov: dict) -> list[str]:
    """The tests that execute any line of the mutant (every test if one runs at import), the
    fastest first: the first failure ends the run."""
    ids: set[str] = set()
    for line in m.lines:
        ids.update(cov["lines"].get(f"{m.module}:{line}", ()))
    chosen = cov["order"] if "" in ids else [t for t in cov["order"] if t in ids]
    return sorted(chosen, key=lambda t: cov["durations"].get(t, 0.0))


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up as Ctrl-C does: children killed, the copies removed


def run_check(modules: list[Path], args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _interrupted)
    tmp = Path(tempfile.mkdtemp(prefix="mutation_core."))
    copies = [tmp / f"copy{j}" for j in range(args.jobs)]
    running: dict[int, tuple[int, Mutant, float]] = {}  # pid -> (copy, mutant, start)
    results: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    try:
        for copy in copies:
            copy_tree(copy)
        tests = sorted({str(p.relative_to(copies[0])) for pattern in args.tests for p in copies[0].glob(pattern)},
                       key=lambda t: next(i for i, pat in enumerate(args.tests) if Path(t).match(pat)))  # fmt: skip
        print(f"tests: {' '.join(tests)}", file=sys.stderr)
        cov_file = tmp / "coverage.json"
        core = str(copies[0] / CORE) + "/"
        code = wait(fork_tests(copies[0], tests, tmp / "traced.log", Coverage(core, traced=True), cov_file), None)
        if code != 0 or not cov_file.exists():
            sys.exit(f"the tests fail with no mutant (exit {code}):\n{(tmp / 'traced.log').read_text()[-3000:]}")
        cov = json.loads(cov_file.read_text())
        for copy in copies:  # the traced run's bytecode of the core would outlive a mutant's edit
            for cache in (copy / CORE).rglob("__pycache__"):
                shutil.rmtree(cache)
            if copy is not copies[0]:
                for cache in (copies[0] / "tests").rglob("__pycache__"):
                    shutil.copytree(cache, copy / cache.relative_to(copies[0]), dirs_exist_ok=True)
        preimport(cov["modules"])
        start, timed = time.monotonic(), tmp / "timed.json"
        if wait(fork_tests(copies[0], tests, tmp / "timed.log", Coverage(core, traced=False), timed), None) != 0:
            sys.exit(f"the tests fail untraced:\n{(tmp / 'timed.log').read_text()[-3000:]}")
        cov["durations"] = json.loads(timed.read_text())["durations"]  # for timeouts and order: untraced
        print(f"the chosen tests take {time.monotonic() - start:.1f} s unmutated, forked", file=sys.stderr)
        queue = []
        for path in modules:
            found = mutants_of(path.relative_to(ROOT).as_posix(), path.read_bytes())
            picked = choose(found, args) if found else []
            results[path.relative_to(ROOT / CORE).as_posix()]["generated"] = found
            for m in picked:
                if m.equivalence and not args.check_equivalent:
                    results[m.module]["equivalent"].append(m)
                else:
                    queue.append(m)
        free = list(range(args.jobs))
        timeouts: dict[int, float] = {}
        done = 0
        while queue or running:
            while queue and free:
                m = queue.pop(0)
                ids = tests_for(m, cov)
                if not ids:
                    results[m.module]["survived"].append((m, "no chosen test runs it"))
                    continue
                slot = free.pop()
                (copies[slot] / m.path).write_bytes(m.source)
                timeout = args.timeout or 3 * sum(cov["durations"].get(t, 0.0) for t in ids) + 5
                pid = fork_tests(copies[slot], ids, tmp / f"mutant{slot}.log")
                running[pid] = (slot, m, time.monotonic() + timeout)
                timeouts[pid] = timeout
            for pid, (slot, m, deadline) in list(running.items()):
                finished, status = os.waitpid(pid, os.WNOHANG)
                late = not finished and time.monotonic() > deadline
                if not finished and not late:
                    continue
                if late:
                    kill(pid)
                    outcome = "timed out"
                else:
                    code = os.waitstatus_to_exitcode(status)
                    outcome = "survived" if code == 0 else "killed" if code in (1, 2, 3, 4) or code < 0 else "error"
                (copies[slot] / m.path).write_bytes((ROOT / m.path).read_bytes())  # the original again
                del running[pid]
                free.append(slot)
                done += 1
                if m.equivalence and outcome != "survived":
                    outcome = "listed equivalent, but " + outcome
                results[m.module][outcome].append((m, "") if outcome == "survived" else m)
                took = time.monotonic() - deadline + timeouts[pid]
                print(f"[{done}] {m.where} {m.kind}: {m.description} -> {outcome} ({took:.1f} s)", file=sys.stderr, flush=True)
            time.sleep(0.005)
    except KeyboardInterrupt:
        print("interrupted: the table holds the mutants run so far", file=sys.stderr)
    finally:
        for pid in running:
            kill(pid)
        shutil.rmtree(tmp, ignore_errors=True)
    return report(results)


def report(results: dict) -> int:
    cols = ("generated", "tried", "killed", "timed out", "survived", "equivalent")
    print("| module | " + " | ".join(cols) + " |")
    print("|---" + "|---:" * len(cols) + "|")
    totals = dict.fromkeys(cols, 0)
    for module in sorted(results):
        r = results[module]
        row = {c: len(r[c]) for c in cols}
        row["tried"] = sum(len(v) for k, v in r.items() if k not in ("generated", "equivalent"))
        totals = {c: totals[c] + row[c] for c in cols}
        print(f"| {module} | " + " | ".join(str(row[c]) for c in cols) + " |")
    print("| all | " + " | ".join(str(totals[c]) for c in cols) + " |")
    bad = [(m, why) for r in results.values() for m, why in r["survived"]]
    wrong = [m for r in results.values() for k, v in r.items() if k.startswith("listed") for m in v]
    errors = [m for r in results.values() for m in r["error"]]
    for title, items in (("survived", bad), ("listed equivalent but killed", [(m, "") for m in wrong]),
                         ("errors (pytest could not run)", [(m, "") for m in errors])):  # fmt: skip
        if items:
            print(f"\n{title}:")
            for m, why in sorted(items, key=lambda x: (x[0].path, x[0].line)):
                print(f"  {m.where}  {m.kind}: {m.description}" + (f"  ({why})" if why else "") + f"\n      {m.text}")
    return 1 if bad or errors else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modules", nargs="+", help="modules under paged_bench/core/ (e.g. scheduler/base.py); default all")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--sample", type=int, help="a random sample of N mutants a module")
    p.add_argument("--seed", default="0", help="the sample's seed")
    group.add_argument("--limit", type=int, help="the first N mutants a module")
    p.add_argument("--lines", nargs="+", help="only the mutants on these lines, as the check prints them "
                                              "(paged_bench/core/kv/paged.py:119)")  # fmt: skip
    p.add_argument("--tests", nargs="+", default=list(TESTS), help="test files (globs), run in this order")
    p.add_argument("--timeout", type=float, help="seconds a mutant's tests may take (default: from the unmutated run)")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once")
    p.add_argument("--check-equivalent", action="store_true", help="run the mutants listed equivalent too")
    p.add_argument("--list", action="store_true", help="print the mutants chosen, run nothing")
    args = p.parse_args(argv)
    core = ROOT / CORE
    modules = sorted(path for path in core.rglob("*.py") if path.name != "__init__.py")
    if args.modules:
        wanted = {core / m for m in args.modules}
        if unknown := wanted - set(modules):
            p.error(f"not modules of {CORE}: {', '.join(sorted(str(u.relative_to(core)) for u in unknown))}")
        modules = [m for m in modules if m in wanted]
    if args.list:
        for path in modules:
            found = mutants_of(path.relative_to(ROOT).as_posix(), path.read_bytes())
            for m in choose(found, args) if found else []:
                print(f"{m.where}  {m.kind}: {m.description}" + ("  [equivalent]" if m.equivalence else "") + f"\n    {m.text}")
        return 0
    return run_check(modules, args)


if __name__ == "__main__":
    sys.exit(main())
